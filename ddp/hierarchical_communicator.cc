#include "ddp/hierarchical_communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"

#include "absl/strings/str_cat.h"
#include "ddp/gloo_communicator.h"
#include "ddp/shm_communicator.h"

namespace lockstep {
namespace ddp {

StatusOr<std::unique_ptr<HierarchicalCommunicator>> HierarchicalCommunicator::Create(
    rendezvous::Store* store, const HierarchicalLayout& layout, HierarchicalOptions options) {
  const HierarchicalLayout& l = layout;
  if (l.local_world_size < 1 || l.num_nodes < 1 || l.local_rank < 0 ||
      l.local_rank >= l.local_world_size || l.node_rank < 0 || l.node_rank >= l.num_nodes ||
      l.world_size != l.num_nodes * l.local_world_size ||
      l.rank != l.node_rank * l.local_world_size + l.local_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm across hosts needs the same number of ranks on every node, numbered node by node: "
        "rank ",
        l.rank, " of ", l.world_size, " is local rank ", l.local_rank, " of ", l.local_world_size,
        " on node ", l.node_rank, " of ", l.num_nodes, ", but rank should be node_rank * ",
        l.local_world_size, " + local_rank and the world ", l.num_nodes, " * ",
        l.local_world_size));
  }
  ShmOptions shm;
  shm.timeout = options.timeout;
  shm.connect_timeout = options.connect_timeout;
  shm.key_prefix = absl::StrCat(options.key_prefix, "/node", l.node_rank);
  shm.hostname = options.hostname;
  shm.progress = options.progress;
  shm.global_ranks = HostRanks(l);
  shm.blame_payload = true;
  auto local = ShmCommunicator::Create(store, l.local_rank, l.local_world_size, shm);
  if (!local.ok()) {
    return Annotate(local.status(), absl::StrCat("shm+gloo: shared memory on node ", l.node_rank));
  }
  std::unique_ptr<Communicator> leaders;
  if (l.local_rank == 0 && l.num_nodes > 1) {
    GlooOptions gloo;
    gloo.hostname = options.gloo_hostname;
    gloo.timeout = options.timeout;
    gloo.connect_timeout = options.connect_timeout;
    gloo.key_prefix = absl::StrCat(options.key_prefix, "/leaders");
    gloo.global_ranks = LeaderRanks(l);
    gloo.blame_payload = true;
    auto mesh = GlooCommunicator::Create(store, l.node_rank, l.num_nodes, gloo);
    if (!mesh.ok()) {
      return Annotate(mesh.status(),
                      absl::StrCat("shm+gloo: node ", l.node_rank,
                                   "'s leader connecting to the other nodes' leaders (node ranks)"));
    }
    leaders = std::move(*mesh);
  }
  return std::unique_ptr<HierarchicalCommunicator>(new HierarchicalCommunicator(
      store, layout, std::move(options), std::move(*local), std::move(leaders)));
}

RankMap HostRanks(const HierarchicalLayout& layout) {
  return RankMap{layout.node_rank * layout.local_world_size, 1};
}

RankMap LeaderRanks(const HierarchicalLayout& layout) {
  return RankMap{0, layout.local_world_size};
}

HierarchicalCommunicator::HierarchicalCommunicator(rendezvous::Store* store,
                                                   const HierarchicalLayout& layout,
                                                   HierarchicalOptions options,
                                                   std::unique_ptr<ShmCommunicator> local,
                                                   std::unique_ptr<Communicator> leaders)
    : store_(store),
      layout_(layout),
      options_(std::move(options)),
      local_(std::move(local)),
      leaders_(std::move(leaders)) {}

HierarchicalCommunicator::~HierarchicalCommunicator() = default;

Status HierarchicalCommunicator::OnHost(const std::shared_ptr<Work>& work, const char* what) const {
  return Annotate(work->Wait(options_.timeout + kWorkWaitSlack),
                  absl::StrCat(what, " on host ", layout_.node_rank, " (local ranks)"));
}

Status HierarchicalCommunicator::BetweenHosts(const std::shared_ptr<Work>& work,
                                              const char* what) const {
  return Annotate(work->Wait(options_.timeout + kWorkWaitSlack),
                  absl::StrCat(what, " between hosts (node ranks of the leaders)"));
}

std::shared_ptr<Work> HierarchicalCommunicator::Run(const char* name,
                                                    std::function<Status()> body) {
  return queue_.Enqueue(name, [this, body = std::move(body)](uint64_t) {
    return FollowBlame(body());
  });
}

Status HierarchicalCommunicator::FollowBlame(Status failed) {
  if (failed.ok()) return failed;
  const int blamed = LostPeerOf(failed);
  failed.ErasePayload(kLostPeerPayload);  // consumed here: not in what the caller prints
  // Keyed by rank alone, not by collective: the hosts may be a collective
  // apart when one freezes (a host that finished collective #k's result
  // broadcast waits in #k+1 for a leader still stuck in #k). A rank
  // publishes once: the queue refuses everything after its first failure.
  const std::string base = absl::StrCat(options_.key_prefix, "/waits/");
  const bool names_peer = blamed >= 0 && blamed < layout_.world_size;
  // Published either way, so that a chain through this rank goes on, or
  // stops at it: -1, it gave up blaming no one (an argument error, a
  // transport error after every rank arrived).
  (void)store_->Set(base + std::to_string(layout_.rank),
                    std::to_string(names_peer ? blamed : -1));
  if (!names_peer) return failed;
  // A rank that saw its peer's process exit follows that peer's own blame
  // if it published one before it exited (it had given up too); one that
  // crashed published none, and is the one: no wait for it.
  const bool peer_exited = failed.code() != absl::StatusCode::kDeadlineExceeded;
  const Duration grace = std::min<Duration>(options_.timeout / 5, kMaxDiagnosisGrace);
  const MonoTime deadline = RealClock()->Now() + grace;
  std::vector<int> chain = {layout_.rank, blamed};
  int at = blamed;
  while (true) {
    const Duration left = peer_exited && at == blamed
                              ? Duration::zero()
                              : std::max<Duration>(deadline - RealClock()->Now(), Duration::zero());
    StatusOr<std::string> next = store_->Get(base + std::to_string(at), left);
    if (!next.ok()) {
      // DeadlineExceeded: `at` never gave up. Any other error is the
      // store's, which says nothing of `at`: the first blame stands.
      if (!absl::IsDeadlineExceeded(next.status())) at = blamed;
      break;
    }
    int n = -1;
    if (!absl::SimpleAtoi(*next, &n) || n < 0 || n >= layout_.world_size) {
      at = blamed;  // `at` gave up blaming no one (or said nothing readable): not the one
      break;
    }
    if (std::find(chain.begin(), chain.end(), n) != chain.end()) {
      at = blamed;  // a cycle: no rank on it is the one
      break;
    }
    chain.push_back(n);
    at = n;
  }
  if (at == blamed) return failed;
  MarkPeerLost(RankMap{}, at);
  return Status(failed.code(),
                absl::StrCat(failed.message(), "; rank ", blamed,
                             " was itself waiting, and the ranks' waits lead to rank ", at,
                             ", which never gave up (", absl::StrJoin(chain, " -> "), ")"));
}

Status HierarchicalCommunicator::RunAllReduce(at::Tensor& tensor, ReduceOp op,
                                              std::vector<InputPiece> pieces) {
  // An average divides each host's sum by the whole world in the host step's
  // own pass: the hosts' quotients then add up to the world's average.
  const double divisor = op == ReduceOp::kAvg ? layout_.world_size : 1.0;
  RETURN_IF_ERROR(
      OnHost(local_->AllReduceDividedFrom(tensor, divisor, std::move(pieces)), "allreduce"));
  if (leader()) {
    RETURN_IF_ERROR(BetweenHosts(leaders_->AllReduce(tensor, ReduceOp::kSum), "allreduce"));
  }
  if (layout_.num_nodes > 1) {
    RETURN_IF_ERROR(OnHost(local_->Broadcast(tensor, 0), "allreduce (result broadcast)"));
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> HierarchicalCommunicator::AllReduce(at::Tensor tensor, ReduceOp op) {
  if (Status s = CheckCpuAllReduce(tensor, op); !s.ok()) return Work::Failed(s);
  return Run("allreduce", [this, tensor, op]() mutable -> Status {
    return RunAllReduce(tensor, op, {});
  });
}

std::pair<int64_t, int64_t> HierarchicalCommunicator::OwnShare(const at::Tensor& tensor) const {
  return local_->OwnShare(tensor);
}

std::shared_ptr<Work> HierarchicalCommunicator::AllReduceFrom(at::Tensor tensor, ReduceOp op,
                                                              std::vector<InputPiece> pieces) {
  if (Status s = CheckCpuAllReduce(tensor, op); !s.ok()) return Work::Failed(s);
  if (Status s = CheckInputPieces(tensor, pieces); !s.ok()) return Work::Failed(s);
  return Run("allreduce", [this, tensor, op, pieces = std::move(pieces)]() mutable -> Status {
    return RunAllReduce(tensor, op, std::move(pieces));
  });
}

StatusOr<at::Tensor> HierarchicalCommunicator::AllocateBucketMemory(int64_t numel,
                                                                    at::ScalarType dtype) {
  return local_->AllocateBucketMemory(numel, dtype);
}

std::shared_ptr<Work> HierarchicalCommunicator::Broadcast(at::Tensor tensor, int root) {
  Status s = CheckCollectiveTensor(tensor, "broadcast");
  if (s.ok()) s = CheckBroadcastRoot(root, layout_.world_size);
  if (!s.ok()) return Work::Failed(s);
  return Run("broadcast", [this, tensor, root]() -> Status {
    const int root_node = root / layout_.local_world_size;
    const int root_local = root % layout_.local_world_size;
    if (layout_.node_rank == root_node) {
      RETURN_IF_ERROR(OnHost(local_->Broadcast(tensor, root_local), "broadcast"));
    }
    if (leader()) RETURN_IF_ERROR(BetweenHosts(leaders_->Broadcast(tensor, root_node), "broadcast"));
    if (layout_.node_rank != root_node) {
      RETURN_IF_ERROR(OnHost(local_->Broadcast(tensor, 0), "broadcast"));
    }
    return absl::OkStatus();
  });
}

std::shared_ptr<Work> HierarchicalCommunicator::AllGather(at::Tensor input, at::Tensor output) {
  if (Status s = CheckAllGather(input, output, layout_.world_size); !s.ok()) {
    return Work::Failed(s);
  }
  return Run("allgather", [this, input, output]() -> Status {
    const int64_t block = input.numel() * layout_.local_world_size;
    // One node: its block is the whole output.
    at::Tensor node_block = layout_.num_nodes > 1 ? at::empty({block}, input.options()) : output;
    RETURN_IF_ERROR(OnHost(local_->AllGather(input, node_block), "allgather"));
    if (layout_.num_nodes == 1) return absl::OkStatus();
    if (leader()) {
      RETURN_IF_ERROR(BetweenHosts(leaders_->AllGather(node_block, output), "allgather"));
    }
    return OnHost(local_->Broadcast(output, 0), "allgather (result broadcast)");
  });
}

std::shared_ptr<Work> HierarchicalCommunicator::Barrier() {
  return Run("barrier", [this]() -> Status {
    RETURN_IF_ERROR(OnHost(local_->Barrier(), "barrier"));
    if (leader()) RETURN_IF_ERROR(BetweenHosts(leaders_->Barrier(), "barrier"));
    if (layout_.num_nodes > 1) RETURN_IF_ERROR(OnHost(local_->Barrier(), "barrier"));
    return absl::OkStatus();
  });
}

}  // namespace ddp
}  // namespace lockstep
