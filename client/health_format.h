// Text for `lockstep status` / `watch`: the per-rank step split and the
// job's health (stragglers, hangs; daemon/straggler.h). Pure formatting.
#ifndef LOCKSTEP_CLIENT_HEALTH_FORMAT_H_
#define LOCKSTEP_CLIENT_HEALTH_FORMAT_H_

#include <string>
#include <vector>

#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace client {

// "RANK  STEP_MS  DATA  FWD  BWD  COMM  OPT" and a row per rank that
// reported a step time (bwd without the exposed comm shown next to it, so a
// row adds up to STEP_MS, less no_sync micro-batches); "" when none did.
std::string StepSplitTable(const v1::Job& job);

// One line per finding, e.g.
//   straggler: rank 1 (others wait 180 ms/step for it, at bucket 0)
//   hang: rank 0 waits 12 s in allreduce (step 41, bucket 3); rank 1 silent for 12 s (last: step 40)
// Empty unless the job is RUNNING and has some.
std::vector<std::string> HealthLines(const v1::Job& job);

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_HEALTH_FORMAT_H_
