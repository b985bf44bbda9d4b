// The "lockstep: STATE  round N  restarts R/M  message" lines that
// `lockstep submit` and `lockstep run` print while they follow a job.
#ifndef LOCKSTEP_CLIENT_STATE_LINES_H_
#define LOCKSTEP_CLIENT_STATE_LINES_H_

#include <ostream>
#include <string>

#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace client {

// A follower polls snapshots of the job, and a state can come and go
// between two of them (the RUNNING of a short round): the state changes a
// snapshot skipped are read back from its history and printed first, each
// on a line of its own; then the snapshot's own line when it changed.
class StateLines {
 public:
  // Prints to `os` what changed in `job` since the last call.
  void Print(const v1::Job& job, std::ostream& os);

  // "RUNNING  round 2  restarts 1/3  <message>" (the message escaped).
  static std::string Line(v1::JobState state, int round, int restarts, int max_restarts,
                          const std::string& message);

 private:
  bool seen_any_ = false;
  v1::JobEvent last_seen_;  // the newest history event of the last snapshot
  v1::JobState state_ = v1::JOB_STATE_UNSPECIFIED;  // of the last line printed
  int round_ = -1;
  std::string last_line_;
};

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_STATE_LINES_H_
