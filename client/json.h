// JSON for scripts (`lockstep ... --json`), from any message by reflection:
//   - every field is present: a scalar at its default (rank 0, restart_count
//     0, "") too, a repeated field as [], a map as {}; an unset message
//     field is null;
//   - integers are JSON numbers (int64 too: pids, milliseconds), doubles
//     are numbers (NaN and infinities, which JSON lacks, are null);
//   - enums are their value names without the type's prefix
//     (JOB_STATE_RUNNING is "RUNNING", ReadLogsRequest.STREAM_STDERR
//     "STDERR");
//   - bytes (log data) are text: UTF-8 as is, an invalid byte as U+FFFD;
//   - keys are the .proto field names (snake_case).
// The .proto files under proto/lockstep/v1/ are the schema.
#ifndef LOCKSTEP_CLIENT_JSON_H_
#define LOCKSTEP_CLIENT_JSON_H_

#include <string>

#include <google/protobuf/message.h>

namespace lockstep {
namespace client {

std::string ToJson(const google::protobuf::Message& message);

// The value name without its enum type's prefix: "JOB_STATE_RUNNING" of
// JobState is "RUNNING"; a name without the prefix stays as it is.
std::string EnumName(const google::protobuf::EnumValueDescriptor& value);

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_JSON_H_
