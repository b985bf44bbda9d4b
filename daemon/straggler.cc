#include "daemon/straggler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/job_machine.h"

namespace lockstep {
namespace daemon {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double WholeSeconds(Duration d) { return std::floor(std::max(0.0, ToSeconds(d))); }

Status BadField(const char* field, double value, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("progress: ", field, " is ", value, ", want ", want));
}

}  // namespace

Status CheckProgress(const v1::RankProgress& p) {
  const struct {
    const char* name;
    double value;
  } durations[] = {{"forward_ms", p.forward_ms()},   {"backward_ms", p.backward_ms()},
                   {"exposed_comm_ms", p.exposed_comm_ms()}, {"step_ms", p.step_ms()},
                   {"data_ms", p.data_ms()},         {"optimizer_ms", p.optimizer_ms()},
                   {"collective_wait_ms", p.collective_wait_ms()}};
  constexpr const char* kDuration = "a duration in ms, 0 to 1e9";
  for (const auto& d : durations) {
    if (!(d.value >= 0 && d.value <= kMaxProgressMs)) return BadField(d.name, d.value, kDuration);
  }
  for (int b = 0; b < p.bucket_wait_ms_size(); ++b) {
    const double v = p.bucket_wait_ms(b);
    if (!(v >= 0 && v <= kMaxProgressMs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("progress: bucket_wait_ms[", b, "] is ", v, ", want ", kDuration));
    }
  }
  if (p.step() < 0) return BadField("step", p.step(), "0 or more");
  if (p.wait_steps() < 0) return BadField("wait_steps", p.wait_steps(), "0 or more");
  if (p.collective_step() < 0) return BadField("collective_step", p.collective_step(), "0 or more");
  if (p.collective_bucket() < -1) {
    return BadField("collective_bucket", p.collective_bucket(), "-1 (none) or a bucket index");
  }
  if (p.collective_op().size() > kMaxCollectiveOpBytes ||
      std::any_of(p.collective_op().begin(), p.collective_op().end(), [](char c) {
        return !absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-';
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("progress: collective_op ", QuoteForError(p.collective_op()),
                     " is not a collective's name ([A-Za-z0-9_-], at most ", kMaxCollectiveOpBytes,
                     " bytes)"));
  }
  return absl::OkStatus();
}

std::optional<v1::Straggler> FindStraggler(const std::vector<v1::RankProgress>& ranks) {
  if (ranks.size() < 2) return std::nullopt;
  size_t buckets = SIZE_MAX;
  int steps = INT32_MAX;
  std::vector<double> step_ms;
  for (const auto& p : ranks) {
    if (p.wait_steps() < kMinStragglerSteps) return std::nullopt;
    buckets = std::min<size_t>(buckets, p.bucket_wait_ms_size());
    steps = std::min(steps, p.wait_steps());
    step_ms.push_back(p.step_ms());
  }
  if (buckets == 0) return std::nullopt;
  double best_lag = 0;
  int best_rank = -1;
  int best_bucket = -1;
  for (size_t b = 0; b < buckets; ++b) {
    size_t candidate = 0;
    double total = 0;
    for (size_t i = 0; i < ranks.size(); ++i) {
      total += ranks[i].bucket_wait_ms(b);
      if (ranks[i].bucket_wait_ms(b) < ranks[candidate].bucket_wait_ms(b)) candidate = i;
    }
    const double least = ranks[candidate].bucket_wait_ms(b);
    const double lag = (total - least) / (ranks.size() - 1) - least;
    if (lag > best_lag) {
      best_lag = lag;
      best_rank = ranks[candidate].rank();
      best_bucket = static_cast<int>(b);
    }
  }
  if (best_rank < 0 || best_lag < kMinStragglerLagMs ||
      best_lag < kMinStragglerLagFraction * Median(step_ms)) {
    return std::nullopt;
  }
  v1::Straggler s;
  s.set_rank(best_rank);
  s.set_lag_ms(std::round(best_lag));
  s.set_bucket(best_bucket);
  s.set_steps(steps);
  return s;
}

std::optional<v1::Hang> FindHang(const std::vector<RankBeat>& beats, int world_size, MonoTime now,
                                 Duration hang_threshold) {
  std::map<int, const RankBeat*> by_rank;
  for (const auto& b : beats) by_rank[b.rank] = &b;
  const RankBeat* longest = nullptr;
  std::vector<int> waiting;
  for (const auto& [rank, b] : by_rank) {
    const bool silent = now - b->reported_at >= kSilentAfter;
    if (silent || !b->in_collective || now - b->collective_since < hang_threshold) continue;
    waiting.push_back(rank);
    if (longest == nullptr || b->collective_since < longest->collective_since) longest = b;
  }
  if (longest == nullptr) return std::nullopt;
  // Arrived in the same collective, later than the threshold allows to call
  // it waiting: not what the waiters wait for.
  std::vector<int> arrived;
  for (const auto& [rank, b] : by_rank) {
    if (now - b->reported_at < kSilentAfter && b->in_collective &&
        b->collective_step == longest->collective_step &&
        b->collective_bucket == longest->collective_bucket) {
      arrived.push_back(rank);
    }
  }
  v1::Hang h;
  for (int r : waiting) h.add_waiting_ranks(r);
  h.set_wait_s(WholeSeconds(now - longest->collective_since));
  h.set_step(longest->collective_step);
  h.set_bucket(longest->collective_bucket);
  h.set_op(longest->op);
  for (int r = 0; r < world_size; ++r) {
    if (std::find(waiting.begin(), waiting.end(), r) != waiting.end()) continue;
    if (std::find(arrived.begin(), arrived.end(), r) != arrived.end()) continue;
    v1::HangCulprit* c = h.add_culprits();
    c->set_rank(r);
    auto it = by_rank.find(r);
    if (it == by_rank.end()) {
      c->set_silent_s(-1);  // never reported
      continue;
    }
    const RankBeat& b = *it->second;
    const bool silent = now - b.reported_at >= kSilentAfter;
    c->set_silent_s(silent ? WholeSeconds(now - b.reported_at) : 0);
    c->set_last_step(b.step);
    c->set_in_collective(b.in_collective);
  }
  return h;
}

void HealthTracker::Update(v1::Job* job, const std::string& node_id,
                           const v1::AgentJobReport& report, MonoTime sent_at,
                           int64_t sent_mono_ns, MonoTime now) {
  const std::string& id = job->job_id();
  if (job->state() != v1::JOB_STATE_RUNNING) {
    job->clear_health();
    jobs_.erase(id);
    return;
  }
  JobBeats& beats = jobs_[id];
  const int round = job->current_round().number();
  if (beats.round != round) {
    beats = JobBeats();
    beats.round = round;
  }
  // The ranks the round gives this node: another node's, or none at all,
  // would overwrite a real rank's beat or add ranks no world has.
  const int node_rank = JobMachine::NodeRank(*job, node_id);
  const int nproc = job->spec().nproc_per_node();
  const int64_t first = static_cast<int64_t>(node_rank) * nproc;
  if (report.round() == round && node_rank >= 0 && sent_mono_ns > 0) {
    for (const auto& w : report.workers()) {
      const v1::RankProgress& p = w.progress();
      if (p.reported_mono_ns() <= 0 || w.state() != v1::WORKER_STATE_RUNNING) continue;
      if (w.rank() < first || w.rank() >= first + nproc || w.rank() >= job->world_size()) continue;
      if (!CheckProgress(p).ok()) continue;
      // How long before the heartbeat's send the agent got the report, on
      // the agent's clock; bounded so a bad clock cannot place it far off.
      int64_t ago_ns = 0;
      if (__builtin_sub_overflow(sent_mono_ns, p.reported_mono_ns(), &ago_ns)) continue;
      const auto ago = std::clamp<Duration>(std::chrono::nanoseconds(ago_ns), Duration(0),
                                            std::chrono::hours(1));
      RankBeat b;
      b.rank = w.rank();
      b.step = p.step();
      b.reported_at = sent_at - ago;
      b.in_collective = p.in_collective();
      b.collective_since =
          b.reported_at - std::chrono::duration_cast<Duration>(
                              std::chrono::duration<double, std::milli>(p.collective_wait_ms()));
      b.collective_step = p.collective_step();
      b.collective_bucket = p.collective_bucket();
      b.op = p.collective_op();
      beats.ranks[b.rank] = b;
    }
  }

  std::vector<v1::RankProgress> progress;
  for (const auto& w : job->workers()) {
    if (w.round() == round && w.state() == v1::WORKER_STATE_RUNNING &&
        CheckProgress(w.progress()).ok()) {
      progress.push_back(w.progress());
    }
  }
  std::optional<v1::Straggler> straggler;
  if (static_cast<int>(progress.size()) == job->world_size()) straggler = FindStraggler(progress);
  std::vector<RankBeat> list;
  for (const auto& [rank, b] : beats.ranks) list.push_back(b);
  std::optional<v1::Hang> hang = FindHang(list, job->world_size(), now, hang_threshold_);

  const Logger log = log_.WithJob(id);
  const int straggler_rank = straggler ? straggler->rank() : -1;
  if (straggler_rank != beats.straggler) {
    if (straggler) {
      log.WithRank(straggler_rank)
          .Warn("straggler: the other ranks wait {:.0f} ms per step for rank {} (bucket {})",
                straggler->lag_ms(), straggler_rank, straggler->bucket());
    } else {
      log.WithRank(beats.straggler).Info("rank {} is no longer a straggler", beats.straggler);
    }
    beats.straggler = straggler_rank;
  }
  if (hang.has_value() != beats.hung) {
    if (hang) {
      std::vector<int> culprits;
      for (const auto& c : hang->culprits()) culprits.push_back(c.rank());
      // About one rank when one is waited for.
      beats.hang_rank = culprits.size() == 1 ? culprits[0] : -1;
      log.WithRank(beats.hang_rank)
          .Warn("hang: ranks [{}] wait {:.0f} s in {} (step {}, bucket {}) for ranks [{}]",
                absl::StrJoin(hang->waiting_ranks(), ", "), hang->wait_s(), hang->op(),
                hang->step(), hang->bucket(), absl::StrJoin(culprits, ", "));
    } else {
      log.WithRank(beats.hang_rank)
          .Info("hang over: no rank waits in a collective past {:.0f} s",
                ToSeconds(hang_threshold_));
    }
    beats.hung = hang.has_value();
  }

  job->clear_health();
  if (straggler) *job->mutable_health()->mutable_straggler() = *straggler;
  if (hang) *job->mutable_health()->mutable_hang() = *hang;
}

}  // namespace daemon
}  // namespace lockstep
