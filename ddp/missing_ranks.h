// Which ranks never reached a point: the store-based diagnosis shared by the
// communicators. Each rank that reaches the point publishes
// "<base><rank>"; a rank that gives up waiting calls ReportAndFindMissing,
// which publishes its own key, waits up to `grace` for every rank's key and
// returns the ranks whose key never appeared (empty: everyone reached it, so
// the failure was not a missing peer). The fast path never touches the store.
#ifndef LOCKSTEP_DDP_MISSING_RANKS_H_
#define LOCKSTEP_DDP_MISSING_RANKS_H_

#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

// Publishes "<base><rank>", then waits up to `grace` for the keys of all
// `world_size` ranks. Returns the ranks whose key is missing, in order.
// Store errors count as "missing" (the diagnosis is best effort).
std::vector<int> ReportAndFindMissing(rendezvous::Store* store, const std::string& base,
                                      int rank, int world_size, Duration grace);

// "[1, 3]".
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_MISSING_RANKS_H_
