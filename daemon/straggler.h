// Job health: which rank a running job waits for, from its ranks' progress
// reports (ddp/progress.h). Plain C++, no gRPC; time is passed in.
//
// Straggler. Each rank reports, per gradient bucket, how long its allreduce
// took from its own launch to completion (mean over its last few steps). A
// collective completes on every rank at about the same moment, so a rank
// that launches late (slow data loading, a slow host) waits least, and each
// other rank's surplus over it is how long that rank waited for it. For
// every bucket the *candidate* is the rank that waits least and the *lag* is
// the other ranks' mean wait minus the candidate's; the straggler is the
// candidate of the bucket with the largest lag, when that lag is at least
// kMinStragglerLagMs and kMinStragglerLagFraction of the median step. No
// clock is compared across hosts.
//
// Hang. Ranks report where they wait on their peers (in a collective since
// when) with every step and at least every second (a liveness beat). The
// coordinator places each report on its own clock (the agent stamps its
// receipt with its monotonic clock, the heartbeat carries the send instant
// on the same clock: see NodeTable::PlaceAgentInstant). A rank is *silent*
// when its latest report is kSilentAfter old; *waiting* when it is not silent
// and has been in a collective for the hang threshold
// (CoordinatorOptions::hang_threshold, default kDefaultHangThreshold). A hang
// is reported while some rank is waiting; its *culprits* are the job's other
// ranks: silent ones (SIGSTOPped, frozen host), ones not in a collective
// (stuck in their own code), ones that never reported.
#ifndef LOCKSTEP_DAEMON_STRAGGLER_H_
#define LOCKSTEP_DAEMON_STRAGGLER_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace daemon {

// Default: a rank blocked in a collective this long is reported as hung
// (well before the engine's collective timeout, 300 s by default).
inline constexpr Duration kDefaultHangThreshold = std::chrono::seconds(5);
// A rank whose latest report is this old is silent (reports come at least
// every second, heartbeats every second: normally under 2.5 s old).
inline constexpr Duration kSilentAfter = std::chrono::seconds(3);
// A straggler lags at least this much per step ...
inline constexpr double kMinStragglerLagMs = 50;
// ... and at least this fraction of the median step time.
inline constexpr double kMinStragglerLagFraction = 0.2;
// Every rank must have averaged over this many steps.
inline constexpr int kMinStragglerSteps = 3;

// Most milliseconds a report's durations (step_ms, bucket_wait_ms,
// collective_wait_ms, ...) may hold: about 11.6 days.
inline constexpr double kMaxProgressMs = 1e9;

// Whether a rank's progress holds what the health checks can use: its
// durations finite and in [0, kMaxProgressMs], its counts (step, wait_steps,
// collective_step) not negative, collective_bucket -1 or more, and
// collective_op a collective's name ([A-Za-z0-9_-], at most 32 bytes); loss
// and samples_per_s are shown, never computed with, and may be anything (a
// diverged run reports a NaN loss). InvalidArgument naming the field and its
// value. The agent refuses such a report; the coordinator leaves it out.
Status CheckProgress(const v1::RankProgress& p);
// The longest collective name in a progress report ("allreduce", ...).
inline constexpr size_t kMaxCollectiveOpBytes = 32;

// The straggler among `ranks` (one latest progress per rank, the whole
// world), or nothing.
std::optional<v1::Straggler> FindStraggler(const std::vector<v1::RankProgress>& ranks);

// One rank's latest report, placed on the coordinator's clock.
struct RankBeat {
  int rank = 0;
  int64_t step = 0;
  MonoTime reported_at{};
  bool in_collective = false;
  MonoTime collective_since{};
  int64_t collective_step = 0;
  int collective_bucket = -1;
  std::string op;
};

// The hang among `beats` (ranks that reported; ranks 0..world_size-1 that
// did not are culprits), or nothing. A rank in the same collective as the
// longest waiter (same step and bucket), not silent, only arrived later: it
// is neither a waiter yet nor a culprit. Seconds are whole (floored).
std::optional<v1::Hang> FindHang(const std::vector<RankBeat>& beats, int world_size, MonoTime now,
                                 Duration hang_threshold);

// Keeps each running job's latest RankBeats and derives Job.health.
// Thread safety: none (the coordinator calls it under its lock).
class HealthTracker {
 public:
  explicit HealthTracker(Duration hang_threshold) : hang_threshold_(hang_threshold) {}

  // Records the workers' progress in `report` (node `node_id`'s report of
  // `job`, already applied to it), sent at `sent_at` on the coordinator's
  // clock, `sent_mono_ns` on the agent's; then sets job->health for `now`
  // (cleared unless RUNNING) and logs when a straggler or a hang appears or
  // ends. Only the ranks the round gives that node count, and only progress
  // CheckProgress accepts; a report without a usable send instant
  // (sent_mono_ns <= 0) places no beat.
  void Update(v1::Job* job, const std::string& node_id, const v1::AgentJobReport& report,
              MonoTime sent_at, int64_t sent_mono_ns, MonoTime now);
  // Drops what is kept for job `id` (it left RUNNING, or was deleted).
  void Forget(const std::string& id) { jobs_.erase(id); }

 private:
  struct JobBeats {
    int round = 0;
    std::map<int, RankBeat> ranks;
    int straggler = -1;     // for logging changes
    bool hung = false;
    int hang_rank = -1;  // the "hang" line's rank (its one culprit or -1), for "hang over"
  };

  const Duration hang_threshold_;
  std::map<std::string, JobBeats> jobs_;
  Logger log_{"health"};
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_STRAGGLER_H_
