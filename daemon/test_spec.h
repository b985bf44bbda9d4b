// TestSpec: the job spec the coordinator's unit tests submit (test only).
#ifndef LOCKSTEP_DAEMON_TEST_SPEC_H_
#define LOCKSTEP_DAEMON_TEST_SPEC_H_

#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// `/bin/train` on min..max nodes x nproc, with a restart budget and a last
// call of `last_call_s`.
inline v1::JobSpec TestSpec(int min_nodes, int max_nodes, int nproc, int max_restarts,
                            double last_call_s = 1) {
  v1::JobSpec spec;
  spec.add_command("/bin/train");
  spec.set_min_nodes(min_nodes);
  spec.set_max_nodes(max_nodes);
  spec.set_nproc_per_node(nproc);
  spec.set_max_restarts(max_restarts);
  spec.set_last_call_timeout_s(last_call_s);
  return spec;
}

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_TEST_SPEC_H_
