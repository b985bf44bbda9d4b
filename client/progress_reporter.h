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
// (kReportDeadline), dropping superseded ones; one lost on the way (a
// deadline passed, the agent not reachable) is sent again until it arrives
// or a newer one replaces it, one the agent refuses is dropped; errors are
// logged at most every few seconds. Flush, and the destructor for at most
// kFinalFlushTimeout, wait for the latest report to arrive, so a rank's
// last step reaches its agent when it exits. Once anything was reported, the
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
// A report lost on the way is sent again after this pause, doubled at each
// loss up to kBeatInterval.
inline constexpr std::chrono::milliseconds kFirstRetryPause{50};
// How long the reporter's destructor (the process's exit) waits for the
// last report to reach the agent.
inline constexpr std::chrono::milliseconds kFinalFlushTimeout{2000};

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
  // Waits, at most `timeout`, until every report made before the call has
  // been delivered to the agent (or refused by it), or replaced by a newer
  // one that was.
  virtual void Flush(std::chrono::milliseconds timeout) = 0;
};

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_PROGRESS_REPORTER_H_
