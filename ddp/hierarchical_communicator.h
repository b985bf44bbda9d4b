// HierarchicalCommunicator: shared memory inside each host, Gloo between
// hosts (CPU tensors). The `shm` backend of a job that spans several nodes.
//
// Layout: the torchrun one, checked in Create: every node runs the same
// number of ranks L, and global rank = node_rank * L + local_rank. Each node's
// ranks share a ShmCommunicator (store prefix "<prefix>/node<n>"); each
// node's local rank 0, its leader, is also in a GlooCommunicator of the
// leaders, ranked by node (prefix "<prefix>/leaders"). So only one rank per
// host sends over the network, with 1/L of the traffic a flat Gloo ring of
// all ranks would put on each host's link.
//
// Collectives (each a sequence of sub-collectives run on this
// communicator's thread, so every rank issues them in the same order):
//   allreduce  shm allreduce on each host; the leaders allreduce over Gloo;
//              shm broadcast from each leader (kAvg: the host step divides
//              its sum by the whole world in its own pass, so the hosts'
//              quotients add up to the average: FusedAverage). On a tensor
//              in bucket memory the host step runs in place, and a rank's
//              own share of it (OwnShare: the slice it reduces on its host)
//              may be handed over as AllReduceFrom's pieces, read where they
//              lie instead of copied in;
//   broadcast  shm broadcast on the root's host from the root; Gloo
//              broadcast among leaders from the root's node; shm broadcast
//              from each leader on the other hosts;
//   allgather  shm allgather on each host into a node block; Gloo allgather
//              of the blocks among leaders (node-major = global rank order);
//              shm broadcast from each leader;
//   barrier    shm barrier; Gloo barrier among leaders; shm barrier.
//
// Errors: a sub-collective's error fails the collective, annotated with
// where it happened, because the ranks it names are numbered there: "on host
// 1 (local ranks)" or "between hosts (node ranks of the leaders)". Then, as
// for every communicator, later calls fail with FailedPrecondition.
//
// Whom a rank blames. A sub-collective blames the peer this rank waited
// for, which may itself be waiting: with rank 3 frozen in a job of 2 hosts x
// 2 ranks, rank 2 waits for it on host 1, node 0's leader (rank 0) waits for
// rank 2 between hosts, and rank 1 waits for rank 0's result broadcast; each
// gives up at about the same time, and the coordinator blames whichever
// reported first (the agents stop the others). So a rank whose collective
// failed publishes whom its sub-collective blamed (kLostPeerPayload, global
// rank; -1 for none) in the store ("<prefix>/waits/<rank>": by rank, not by
// collective, since the hosts may be a collective apart when one freezes,
// and a rank fails once: the queue refuses the rest) and follows the
// published blames from its peer (1 -> 0 -> 2 -> 3) for up to
// min(timeout / 5, 5 s) in all, to the first rank that published none: the
// one that never gave up (frozen, hung, or gone). It marks that rank lost
// (worker_link) and names the chain in its error. A chain that comes back to
// a rank already on it, that reaches a rank that blamed no one, or a store
// that cannot be read, keeps the first blame. A rank that saw its peer's
// process exit looks at once whether the peer had published (it had given
// up before exiting), and blames it if not (it crashed). So a collective
// that times out may fail up to that much later. Limit: a rank that gives
// up more than that grace after this one (it began waiting later) is taken
// for the one that never did.
//
// Thread safety: thread-safe (see Communicator).
#ifndef LOCKSTEP_DDP_HIERARCHICAL_COMMUNICATOR_H_
#define LOCKSTEP_DDP_HIERARCHICAL_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "ddp/collective_queue.h"
#include "ddp/communicator.h"
#include "ddp/missing_ranks.h"
#include "ddp/shm_communicator.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

struct HierarchicalLayout {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
};

// How the sub-communicators' ranks map to the job's (rank = node_rank *
// local_world_size + local_rank), so a lost peer is marked by its global
// rank: the host's shared-memory ranks are its local ranks; the leaders'
// Gloo ranks are node ranks, each standing for its node's leader (local
// rank 0).
RankMap HostRanks(const HierarchicalLayout& layout);
RankMap LeaderRanks(const HierarchicalLayout& layout);

struct HierarchicalOptions {
  // Every sub-collective's timeout; a collective may take up to three times
  // it. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // Bound on each sub-communicator's setup.
  Duration connect_timeout = rendezvous::kDefaultStoreTimeout;
  // Address the leaders' Gloo device binds and advertises.
  std::string gloo_hostname = "127.0.0.1";
  std::string key_prefix = "hier";
  // The host name each rank reports to its node's shm setup (tests: "").
  std::string hostname;
  // The shm bootstrap's progress lines (ShmOptions::progress).
  ProgressLog progress;
};

class HierarchicalCommunicator : public Communicator {
 public:
  // Builds this node's shm communicator, then (leaders) the leaders' Gloo
  // mesh. Errors: InvalidArgument when the layout is not the uniform one
  // above (the message gives the numbers); the sub-communicators' errors,
  // annotated with the node.
  static StatusOr<std::unique_ptr<HierarchicalCommunicator>> Create(
      rendezvous::Store* store, const HierarchicalLayout& layout,
      HierarchicalOptions options = {});
  ~HierarchicalCommunicator() override;

  int rank() const override { return layout_.rank; }
  int world_size() const override { return layout_.world_size; }
  std::string backend() const override { return "shm+gloo"; }
  bool FusedAverage() const override { return true; }

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override;
  std::shared_ptr<Work> Barrier() override;
  // This host's shm bucket memory (ShmCommunicator::AllocateBucketMemory),
  // so the host-local step of an allreduce of a bucket runs in place; the
  // leaders' Gloo step and the result broadcast read and write it like any
  // memory. Collective among this host's ranks; each host decides alone.
  StatusOr<at::Tensor> AllocateBucketMemory(int64_t numel, at::ScalarType dtype) override;
  // The host step's share (ShmCommunicator::OwnShare): the slice of a
  // float32 tensor in this host's bucket memory that this rank reduces
  // there. {0, 0} on any other tensor.
  std::pair<int64_t, int64_t> OwnShare(const at::Tensor& tensor) const override;
  // The host step is the shm AllReduceFrom (pieces inside the own share
  // read in place, others copied in); the steps between hosts and the
  // result broadcast are as for AllReduce.
  std::shared_ptr<Work> AllReduceFrom(at::Tensor tensor, ReduceOp op,
                                      std::vector<InputPiece> pieces) override;

  // Diagnostics: the host communicator's count of input elements it read
  // from pieces in place (ShmCommunicator::elements_read_from_pieces).
  uint64_t host_elements_read_from_pieces() const { return local_->elements_read_from_pieces(); }

 private:
  HierarchicalCommunicator(rendezvous::Store* store, const HierarchicalLayout& layout,
                           HierarchicalOptions options, std::unique_ptr<ShmCommunicator> local,
                           std::unique_ptr<Communicator> leaders);

  // Enqueues `body` as one collective; its error goes through FollowBlame.
  std::shared_ptr<Work> Run(const char* name, std::function<Status()> body);
  // A collective's error: publishes whom it blamed and follows the blames
  // published by the others to the rank that never gave up (see the header
  // comment). OK passes through.
  Status FollowBlame(Status failed);

  // The allreduce's steps (AllReduce, AllReduceFrom), on the queue's thread.
  Status RunAllReduce(at::Tensor& tensor, ReduceOp op, std::vector<InputPiece> pieces);

  // Waits for a sub-collective; annotates a failure with where it ran.
  Status OnHost(const std::shared_ptr<Work>& work, const char* what) const;
  Status BetweenHosts(const std::shared_ptr<Work>& work, const char* what) const;
  bool leader() const { return leaders_ != nullptr; }

  rendezvous::Store* const store_;
  const HierarchicalLayout layout_;
  const HierarchicalOptions options_;
  std::unique_ptr<ShmCommunicator> local_;
  std::unique_ptr<Communicator> leaders_;  // Local rank 0 of a multi-node job only.
  CollectiveQueue queue_{"shm+gloo"};      // Last: stops before the sub-communicators go.
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_HIERARCHICAL_COMMUNICATOR_H_
