// ProgressReporter: what a training program links to report its progress
// (step, samples/s, loss, comm stats) to its node's agent, which forwards
// the latest per rank to the coordinator (`lockstep watch`, `status`).
//
//   auto reporter = lockstep::client::ProgressReporter::FromEnv();
//   for (...) { ...; reporter->Report({.step = s, .loss = l}); }
//   reporter->Flush(std::chrono::seconds(1));
//
// Reads LOCKSTEP_AGENT, LOCKSTEP_AGENT_TOKEN, LOCKSTEP_JOB_ID,
// LOCKSTEP_ROUND and LOCKSTEP_RANK; a no-op when LOCKSTEP_AGENT is unset
// (a worker started by hand). Report never blocks training: it stores the
// latest value and a background thread sends it with a short deadline
// (kReportDeadline), dropping superseded ones; errors are logged at most
// every few seconds and otherwise ignored. Once anything was reported, the
// thread also resends the latest report every kBeatInterval with the
// current CollectiveState (how long the rank has waited so far), so a rank
// blocked in a collective keeps telling the coordinator where, and a rank
// that stops reporting (SIGSTOP, a hang outside the engine) is noticed.
//
// Thread safety: Report and Flush may be called from any thread.
#ifndef LOCKSTEP_CLIENT_PROGRESS_REPORTER_H_
#define LOCKSTEP_CLIENT_PROGRESS_REPORTER_H_

#include <chrono>
#include <cstdint>
#include <memory>

#include "ddp/progress.h"

namespace lockstep {
namespace client {

// Deadline of one report RPC.
inline constexpr std::chrono::milliseconds kReportDeadline{500};
// Default: a report at least this often, new step or not.
inline constexpr std::chrono::milliseconds kBeatInterval{1000};

// One rank's progress: the engine's per-step report (ddp/progress.h), one
// shape from DDP to the agent's RankProgress. `samples` is not sent.
using Progress = ddp::StepProgress;

class ProgressReporter {
 public:
  // Never null; disabled (every call a no-op) without LOCKSTEP_AGENT.
  static std::unique_ptr<ProgressReporter> FromEnv();
  virtual ~ProgressReporter() = default;

  virtual bool enabled() const = 0;
  // Records `p` as the latest progress; returns at once.
  virtual void Report(const Progress& p) = 0;
  // Records where the rank waits on its peers (ddp/progress.h); returns at
  // once. Sent with the next report or beat.
  virtual void SetCollective(const ddp::CollectiveState& c) = 0;
  // Sends the latest unsent report, waiting at most `timeout`.
  virtual void Flush(std::chrono::milliseconds timeout) = 0;
};

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_PROGRESS_REPORTER_H_
