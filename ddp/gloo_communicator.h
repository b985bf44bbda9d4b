// GlooCommunicator: the Communicator over Gloo's TCP transport (CPU).
//
// Bootstrap: every rank marks its arrival ("<key_prefix>/arrived/<rank>")
// and waits for all the others (logging every few seconds whom it waits
// for; past connect_timeout the error names them). Then it publishes its
// pair addresses ("<key_prefix>/mesh<attempt>/<rank>") and connects a full
// mesh of TCP pairs, one listening socket per pair that accepts the first
// connection and closes: once the mesh is up, no Gloo port listens.
// Because a pair takes the *first* connection, a stray one that arrives
// before the real peer would take its place. So the mesh is checked before
// use: an allgather over every pair must return each rank's own
// {rank, world, mesh nonce} (the nonce is rank 0's, per attempt). Every rank
// publishes its verdict and waits for the others'; if any failed, all of
// them build a fresh mesh (new ports), at most kMaxMeshAttempts times.
// SIGPIPE is ignored (unless the program handles it), so a peer that goes
// away fails a collective instead of killing the process. Collectives
// run one at a time, in call order, on a dedicated communicator thread, so
// the caller (the autograd thread, for the Reducer) never blocks on the
// network. Gloo throws; nothing thrown leaves this class: failures become
// Work errors.
//
// Missing-peer diagnosis. Gloo's own timeout says only that a receive timed
// out, which on a ring names a neighbour, not the culprit. So each
// collective runs with the Gloo timeout `timeout - grace` (grace =
// min(timeout / 5, kMaxDiagnosisGrace)); a rank whose collective #n fails
// writes the store key "<key_prefix>/failed/<n>/<rank>" and waits up to
// `grace` for the same key from every other rank. Ranks stuck in collective
// #n time out too and report; a rank that never reached #n (hung, crashed,
// busy elsewhere) does not, and the error names it:
//   "gloo allreduce #12 on rank 0 failed: ranks [2] did not arrive within 10 s".
// The fast path costs nothing: the store is touched only after a failure.
// So a collective fails within `timeout` (plus a store round trip).
//
// Thread safety: thread-safe (see Communicator). The destructor lets queued
// collectives finish (each bounded by its timeout) and joins the thread.
#ifndef LOCKSTEP_DDP_GLOO_COMMUNICATOR_H_
#define LOCKSTEP_DDP_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "ddp/collective_queue.h"
#include "ddp/communicator.h"
#include "ddp/missing_ranks.h"
#include "rendezvous/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace lockstep {
namespace ddp {

inline constexpr size_t kDefaultGlooSegmentBytes = 4u << 20;

// Meshes Create builds before giving up when each fails its check.
inline constexpr int kMaxMeshAttempts = 3;
// Upper bound of the mesh check's allgather (a pair hijacked by a stray
// connection makes its peer wait this long before the mesh is rebuilt).
inline constexpr std::chrono::seconds kMeshCheckTimeout{10};

// Upper bound of the time a failed rank waits for the others' reports.
inline constexpr std::chrono::seconds kMaxDiagnosisGrace{5};

struct GlooOptions {
  // Address the TCP device binds and advertises. Default: loopback.
  std::string hostname = "127.0.0.1";
  // End-to-end timeout of every collective. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // How long Create waits for every rank to publish its address.
  // Default: rendezvous::kDefaultStoreTimeout.
  Duration connect_timeout = rendezvous::kDefaultStoreTimeout;
  // Store key prefix; communicators sharing a store namespace need distinct
  // prefixes. Default: "gloo".
  std::string key_prefix = "gloo";
  // Largest send/receive of the ring allreduce (two are in flight); 0 means
  // Gloo's own 1 MB. Default: kDefaultGlooSegmentBytes, which measured
  // ~10-30% less CPU per large allreduce than 1 MB on loopback here
  // (bench/allreduce_bench --segment-kb).
  size_t max_segment_bytes = kDefaultGlooSegmentBytes;
  // This communicator's ranks as the job's, for the lost-peer mark.
  // Default: the identity (a communicator over the whole job).
  RankMap global_ranks;
  // A collective that fails blaming a peer carries that peer's global rank
  // as kLostPeerPayload (missing_ranks.h), for the HierarchicalCommunicator
  // built over this one, which consumes it. Default: false (a payload would
  // show in every printed error).
  bool blame_payload = false;
};

class GlooCommunicator : public Communicator {
 public:
  // Connects and checks the full mesh. Blocks until every rank has called
  // Create with the same store namespace and prefix, or `connect_timeout`
  // passes for one of its waits (the arrival, then per mesh attempt, at most
  // 3, the nonce, the connection and the verdicts). Errors: InvalidArgument (rank/world), DeadlineExceeded naming
  // the ranks that never arrived, Unavailable (transport, or every mesh
  // attempt failed its check).
  // `store` must outlive the communicator.
  static StatusOr<std::unique_ptr<GlooCommunicator>> Create(rendezvous::Store* store, int rank,
                                                           int world_size,
                                                           GlooOptions options = {});
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "gloo"; }

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override;
  std::shared_ptr<Work> Barrier() override;

 private:
  GlooCommunicator(rendezvous::Store* store, int rank, int world_size, GlooOptions options,
                   std::shared_ptr<gloo::Context> context);

  // `body` runs the Gloo calls with the given Gloo timeout and tag; it may
  // throw: a gloo::IoException (a peer's connection failed or timed out)
  // becomes the Work's error, diagnosed; any other is this rank's own
  // (Internal, no peer named). Either way every connection is closed first
  // (CloseConnections). Queues it for the communicator thread.
  std::shared_ptr<Work> Enqueue(const char* name,
                                std::function<void(std::chrono::milliseconds, uint32_t)> body);
  // Maps a failure of collective #seq to a Status naming the missing ranks.
  Status Diagnose(uint64_t seq, const char* name, const std::string& what);
  // Closes the connection to every peer, so that each of them fails its
  // collective at once instead of at its own timeout.
  void CloseConnections();

  rendezvous::Store* const store_;
  const int rank_;
  const int world_size_;
  const GlooOptions options_;
  const Duration grace_;
  std::shared_ptr<gloo::Context> context_;

  // Last: destroyed first, so its thread stops before the context goes.
  CollectiveQueue queue_{"gloo"};
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_GLOO_COMMUNICATOR_H_
