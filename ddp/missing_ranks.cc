#include "ddp/missing_ranks.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace ddp {

std::vector<int> ReportAndFindMissing(rendezvous::Store* store, const std::string& base,
                                      int rank, int world_size, Duration grace) {
  (void)store->Set(base + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(base + std::to_string(r));
  std::vector<int> missing;
  if (store->Wait(keys, grace).ok()) return missing;
  for (int r = 0; r < world_size; ++r) {
    if (!store->Get(keys[r], Duration::zero()).ok()) missing.push_back(r);
  }
  return missing;
}

std::string FormatRanks(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace ddp
}  // namespace lockstep
