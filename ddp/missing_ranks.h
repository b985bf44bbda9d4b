// Which ranks never reached a point: the store-based diagnosis shared by the
// communicators. Each rank that reaches the point publishes
// "<base><rank>"; a rank that gives up waiting calls ReportAndFindMissing,
// which publishes its own key, waits up to `grace` for every rank's key and
// returns the ranks whose key never appeared (empty: everyone reached it, so
// the failure was not a missing peer). The fast path never touches the store.
#ifndef LOCKSTEP_DDP_MISSING_RANKS_H_
#define LOCKSTEP_DDP_MISSING_RANKS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

// Publishes "<base><rank>", then waits up to `grace` for the keys of all
// `world_size` ranks. Returns the ranks whose key is missing, in order. A
// store error other than a key not there in time (the store down or not
// answering, the namespace closed) stops the diagnosis there: it is stored
// in *store_error and none is returned, as it tells nothing of any rank.
std::vector<int> ReportAndFindMissing(rendezvous::Store* store, const std::string& base,
                                      int rank, int world_size, Duration grace,
                                      Status* store_error);

// How a communicator's ranks map to the job's global ranks, for the
// lost-peer mark (worker_link::MarkPeerLost, which the coordinator reads as
// a global rank): global = base + stride * rank. The identity for a
// communicator over the whole job; HierarchicalCommunicator gives its
// per-host and leaders' communicators theirs.
struct RankMap {
  int base = 0;
  int stride = 1;
  int Global(int rank) const { return rank < 0 ? -1 : base + stride * rank; }
};

// worker_link::MarkPeerLost of `rank` (-1: not known) in `map`'s numbering.
void MarkPeerLost(const RankMap& map, int rank);

// A collective that fails because peer `rank` (in `map`'s numbering; -1:
// not known) is gone or did not arrive: marks it lost (MarkPeerLost) and
// returns `error`, which, with `attach` (GlooOptions/ShmOptions::
// blame_payload), carries the peer's global rank as kLostPeerPayload, so
// the HierarchicalCommunicator built over the communicator can follow it
// (it removes the payload from what it returns: absl prints payloads with
// the message). LostPeerOf reads it (-1: none). Annotate keeps it.
inline constexpr char kLostPeerPayload[] = "lockstep.dev/lost-peer";
Status PeerLostError(Status error, const RankMap& map, int rank, bool attach);
int LostPeerOf(const Status& status);

// How often a bootstrap wait logs whom it still waits for.
inline constexpr Duration kBootstrapProgressInterval = std::chrono::seconds(5);

// Where bootstrap waits report progress: one line per call (the callers
// that have spdlog log it; the CMake build of the ddp core has none).
using ProgressLog = std::function<void(const std::string& line)>;

// The store key under which JoinStore (init.h) says why it refused `rank`
// (a world size that is not the store's), for WaitForRanks to name.
std::string RefusedRankKey(int rank);

// The bootstrap wait every communicator uses: waits until the key of every
// rank in `keys` (rank -> key) is set, for at most `timeout`. Every
// `interval` it tells `progress` (if set) "<what>: still waiting for ranks
// [..] (Ns of Ts)", so a rank whose peer never starts says whom it waits for.
// Errors: DeadlineExceeded "<what>: ranks [..] did not arrive within T s";
// FailedPrecondition, at its next look, when a missing rank was refused by
// the store (RefusedRankKey: "<what>: rank R was refused by the store: it
// came with a world of W ranks, not X"), or when the store lost its keys
// (Store::Lost: a store server that restarted), naming no rank and marking
// none; the store's other errors, annotated with `what`.
// The rank it gives up on is marked lost through `map`.
Status WaitForRanks(rendezvous::Store* store, const std::vector<std::pair<int, std::string>>& keys,
                    Duration timeout, const std::string& what, const ProgressLog& progress,
                    Duration interval = kBootstrapProgressInterval, const RankMap& map = {});

// "[1, 3]".
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_MISSING_RANKS_H_
