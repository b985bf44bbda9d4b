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
//              shm broadcast from each leader (kAvg divides by the world at
//              the end);
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
// Thread safety: thread-safe (see Communicator).
#ifndef LOCKSTEP_DDP_HIERARCHICAL_COMMUNICATOR_H_
#define LOCKSTEP_DDP_HIERARCHICAL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "common/status.h"
#include "ddp/collective_queue.h"
#include "ddp/communicator.h"
#include "ddp/missing_ranks.h"
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

  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override;
  std::shared_ptr<Work> Barrier() override;
  // This host's shm bucket memory (ShmCommunicator::AllocateBucketMemory),
  // so the host-local step of an allreduce of a bucket runs in place; the
  // leaders' Gloo step and the result broadcast read and write it like any
  // memory. Collective among this host's ranks; each host decides alone.
  StatusOr<at::Tensor> AllocateBucketMemory(int64_t numel, at::ScalarType dtype) override;

 private:
  HierarchicalCommunicator(const HierarchicalLayout& layout, HierarchicalOptions options,
                           std::unique_ptr<Communicator> local,
                           std::unique_ptr<Communicator> leaders);

  // Waits for a sub-collective; annotates a failure with where it ran.
  Status OnHost(const std::shared_ptr<Work>& work, const char* what) const;
  Status BetweenHosts(const std::shared_ptr<Work>& work, const char* what) const;
  bool leader() const { return leaders_ != nullptr; }

  const HierarchicalLayout layout_;
  const HierarchicalOptions options_;
  std::unique_ptr<Communicator> local_;
  std::unique_ptr<Communicator> leaders_;  // Local rank 0 of a multi-node job only.
  CollectiveQueue queue_{"shm+gloo"};      // Last: stops before the sub-communicators go.
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_HIERARCHICAL_COMMUNICATOR_H_
