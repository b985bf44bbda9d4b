// Progress reporting from the engine: every synchronised step of a
// DistributedDataParallel is reported to the process's progress sink, so a
// training program under lockstepd shows its step, throughput and loss in
// `lockstep status` / `watch` without code of its own.
//
// The sink is shared by the process's DDP instances: made by the factory
// registered last when the first of them asks, destroyed (and flushed) with
// the last of them, before main returns. //ddp:init_from_env_grpc (the CMake package: always)
// registers one that sends to this node's agent (client/progress_reporter.h,
// LOCKSTEP_AGENT); with no agent, or no factory, there is no sink and
// reporting costs nothing.
//
// Thread safety: every function may be called from any thread; a sink's
// Report must return at once (it runs on the autograd thread).
#ifndef LOCKSTEP_DDP_PROGRESS_H_
#define LOCKSTEP_DDP_PROGRESS_H_

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>

namespace lockstep {
namespace ddp {

struct StepProgress {
  int64_t step = 0;               // Synchronised steps so far (after ResumeAt: absolute).
  int64_t samples = 0;            // This rank's samples in the step (DDP's CountSamples).
  double samples_per_s = 0;       // `samples` over wall-clock time, step end to step end.
  double loss = std::nan("");     // Sum of the losses passed to Backward since the last step; NaN
                                  // when unknown (a CUDA loss is not copied to the host for it).
  double forward_ms = 0;
  double backward_ms = 0;
  double exposed_comm_ms = 0;
  int64_t bytes_reduced = 0;
  int buckets = 0;
};

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // Records `p` as the latest progress; must not block.
  virtual void Report(const StepProgress& p) = 0;
  // Sends what is unsent, waiting at most `timeout`.
  virtual void Flush(std::chrono::milliseconds timeout) = 0;
};

// Returns the sink, or null for "do not report" (no agent to report to).
using ProgressSinkFactory = std::function<std::unique_ptr<ProgressSink>()>;

// Installs the factory sinks are made with (last call wins; a sink in use
// is kept).
void RegisterProgressSinkFactory(ProgressSinkFactory factory);

// The process's sink, made if no one holds it; null when there is none.
std::shared_ptr<ProgressSink> AcquireProgressSink();

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_PROGRESS_H_
