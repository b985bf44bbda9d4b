#include "ddp/missing_ranks.h"

#include <algorithm>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/worker_link.h"

namespace lockstep {
namespace ddp {

std::vector<int> ReportAndFindMissing(rendezvous::Store* store, const std::string& base,
                                      int rank, int world_size, Duration grace,
                                      Status* store_error) {
  (void)store->Set(base + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(base + std::to_string(r));
  std::vector<int> missing;
  const Status waited = store->Wait(keys, grace);
  if (waited.ok()) return missing;
  // Only "not there in time" tells which ranks are missing; any other error
  // is the store's (down, not answering, the namespace closed) and says
  // nothing of any rank: asking on, key by key, would cost each its RPC
  // timeout and blame every rank.
  if (!absl::IsDeadlineExceeded(waited)) {
    *store_error = waited;
    return {};
  }
  for (int r = 0; r < world_size; ++r) {
    // Not this rank, even when its own mark could not be written: it is here.
    if (r == rank) continue;
    const StatusOr<std::string> got = store->Get(keys[r], Duration::zero());
    if (got.ok()) continue;
    if (!absl::IsDeadlineExceeded(got.status())) {
      *store_error = got.status();
      return {};
    }
    missing.push_back(r);
  }
  return missing;
}

void MarkPeerLost(const RankMap& map, int rank) { worker_link::MarkPeerLost(map.Global(rank)); }

Status PeerLostError(Status error, const RankMap& map, int rank, bool attach) {
  MarkPeerLost(map, rank);
  if (attach && !error.ok() && rank >= 0) {
    error.SetPayload(kLostPeerPayload, absl::Cord(std::to_string(map.Global(rank))));
  }
  return error;
}

int LostPeerOf(const Status& status) {
  const auto payload = status.GetPayload(kLostPeerPayload);
  int rank = -1;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &rank) || rank < 0) return -1;
  return rank;
}

Status WaitForRanks(rendezvous::Store* store, const std::vector<std::pair<int, std::string>>& keys,
                    Duration timeout, const std::string& what, const ProgressLog& progress,
                    Duration interval, const RankMap& map) {
  const MonoTime start = RealClock()->Now();
  const MonoTime deadline = start + timeout;
  std::vector<std::pair<int, std::string>> missing = keys;
  while (true) {
    const MonoTime now = RealClock()->Now();
    const Duration slice = std::min<Duration>(interval, std::max<Duration>(deadline - now, {}));
    std::vector<std::string> names;
    for (const auto& [r, key] : missing) names.push_back(key);
    Status s = store->Wait(names, slice);
    if (s.ok()) return s;
    if (s.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    // A store that restarted lost the keys of the ranks that came before:
    // they are not missing, and none is to blame.
    if (Status lost = store->Lost(); !lost.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": ", lost.message()));
    }
    std::vector<std::pair<int, std::string>> still;
    for (const auto& entry : missing) {
      if (!store->Get(entry.second, Duration::zero()).ok()) still.push_back(entry);
    }
    missing = std::move(still);
    if (missing.empty()) return absl::OkStatus();
    std::vector<int> ranks;
    for (const auto& entry : missing) {
      ranks.push_back(entry.first);
      auto refused = store->Get(RefusedRankKey(map.Global(entry.first)), Duration::zero());
      if (refused.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": rank ", map.Global(entry.first), " was refused by the store: it ", *refused,
            "; every rank must be started with the same WORLD_SIZE"));
      }
    }
    if (RealClock()->Now() >= deadline) {
      // Those ranks never came: this worker's failure follows theirs (its
      // agent tells the coordinator, which blames the first of them).
      MarkPeerLost(map, ranks.front());
      return absl::DeadlineExceededError(absl::StrCat(what, ": ranks ", FormatRanks(ranks),
                                                      " did not arrive within ",
                                                      ToSeconds(timeout), " s"));
    }
    if (progress) {
      progress(absl::StrCat(what, ": still waiting for ranks ", FormatRanks(ranks), " (",
                            static_cast<int64_t>(ToSeconds(RealClock()->Now() - start)), " s of ",
                            ToSeconds(timeout), " s)"));
    }
  }
}

std::string RefusedRankKey(int rank) { return absl::StrCat("lockstep/refused/", rank); }

std::string FormatRanks(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace ddp
}  // namespace lockstep
