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
#include <string>
#include <vector>

namespace lockstep {
namespace ddp {

// Steps the straggler figures (StepProgress::bucket_wait_ms) average over.
inline constexpr int kWaitWindowSteps = 8;

// One step of one rank. The step split, on this rank's monotonic clock:
//
//   step end -data-> forward -forward-> end of forward -backward-> gradients
//   synced -optimizer-> step end
//
// A step ends when DDP::OptimizerStep returns, or, in a program that does not
// call it, when the gradients are synchronised (the optimizer then falls in
// `data_ms` of the next step and `optimizer_ms` is 0). backward_ms includes
// exposed_comm_ms (the part of it spent waiting on buckets), so
// data + forward + backward + optimizer = step_ms, less the no_sync
// micro-batches' forwards and backwards, which are in none of them. With
// overlap_forward a step ends when OptimizerStep returns with buckets still
// on the wire: the waits for them run in the next forward and count in its
// forward_ms, so this step's backward_ms is autograd's alone and its
// exposed_comm_ms 0; so do its bucket steps, so its optimizer_ms is the
// OptimizerStep call's alone.
struct StepProgress {
  int64_t step = 0;               // Synchronised steps so far (after ResumeAt: absolute).
  int64_t samples = 0;            // This rank's samples in the step (DDP's CountSamples).
  double samples_per_s = 0;       // `samples` over step_ms (wall clock, step end to step end).
  double loss = std::nan("");     // Sum of the losses passed to Backward since the last step; NaN
                                  // when unknown (a CUDA loss is not copied to the host for it).
  double forward_ms = 0;          // The synchronised forward, buffer broadcast included.
  double backward_ms = 0;         // End of forward to gradients synchronised.
  double exposed_comm_ms = 0;     // Time the end of backward waited on buckets.
  int64_t bytes_reduced = 0;
  int buckets = 0;
  double step_ms = 0;             // Previous step end to this step end (0 for the first step).
  double data_ms = 0;             // Previous step end to this step's first forward.
  double optimizer_ms = 0;        // Inside DDP::OptimizerStep.
  // Straggler figures: per bucket, how long its collective took from this
  // rank's launch to its completion, mean over the last `wait_steps` steps
  // (at most kWaitWindowSteps). A collective completes on every rank at about
  // the same moment, so a rank that launches late waits least: the others'
  // surplus over it is how long they wait for it. Needs no clock sync.
  std::vector<double> bucket_wait_ms;
  int wait_steps = 0;
};

// Where a rank is blocked on its peers, for hang reports: set when the
// engine starts waiting on a collective, cleared when it completes.
struct CollectiveState {
  bool active = false;
  int64_t step = 0;         // The step the collective belongs to (steps done + 1).
  int bucket = -1;          // Gradient bucket waited on; -1 for a broadcast.
  std::string op;           // "allreduce" or "broadcast".
  std::chrono::steady_clock::time_point since{};  // When the wait began.
};

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // Records `p` as the latest progress; must not block.
  virtual void Report(const StepProgress& p) = 0;
  // Records where the rank waits on its peers (a sink that beats sends it
  // with its liveness reports); must not block. Default: ignored.
  virtual void SetCollective(const CollectiveState& c) { (void)c; }
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
