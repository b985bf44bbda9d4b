// ShmCommunicator: the Communicator for ranks on one host, over a POSIX
// shared-memory segment (CPU tensors). The fast path for single-host jobs:
// an allreduce is a copy into shared memory, a reduction of 1/world of the
// data by each rank, and a copy out, with no sockets and no kernel crossing
// on the data path.
//
// Bootstrap: every rank publishes its host name under
// "<key_prefix>/host/<rank>". Rank 0 creates the segment as an anonymous
// memfd (memfd_create: no name in /dev/shm, ever) and publishes
// "<pid>:<fd>:<nonce>" under "<key_prefix>/segment"; the others check that
// they are on rank 0's host, open it through /proc/<pid>/fd/<fd> (which
// needs the same user and pid namespace: ranks started by one lockstepd
// agent, or by hand on one host), check the nonce in its header, map it
// and mark themselves attached. Once every rank is attached rank 0 closes
// the fd. The memory goes when the last process unmaps it, so a stop at any
// moment of the bootstrap leaves nothing behind. The store namespace is the
// job's round, so a rank can only ever find its own round's segment.
//
// Layout: a header, one 64-byte control line per rank (a phase counter and
// its pid), one 64-byte call line per rank (see "Agreement"), then one slot
// per rank, split in two halves used alternately.
// Synchronisation is a phase barrier: a rank publishes phase p and waits
// until every rank's phase is at least p. Chunks alternate between the two
// halves of each slot, so a rank may write chunk i+1 while slower ranks still
// read chunk i: an allreduce costs two barriers per chunk, a broadcast or an
// allgather one. Each element is reduced by exactly one rank, so every rank
// ends with bit-identical results.
//
// Agreement: every rank must issue the same collectives, in the same order,
// with the same sizes, dtypes and roots (communicator.h); the barrier only
// counts arrivals, so ranks out of step would pass it, and their slot halves
// would drift apart for good. So each collective publishes in its rank's
// call line what it is (sequence number, kind, dtype, bytes, and the root
// of a broadcast or the divisor of an allreduce) before its first barrier,
// and after that barrier, before it reads any peer's slot, compares every
// peer's entry with its own. Every rank sees every entry, so all fail
// together, with InvalidArgument naming both ("shm broadcast #7 on rank 0:
// ranks are out of step: this rank is in broadcast #7 (1024 bytes of
// Float, root 0), rank 1 is in barrier #7: every rank must issue the same
// collectives, ..."); none marks a peer lost (each is alive; the program
// is wrong), and the communicator is broken as after any failure. A call
// line holds two entries, indexed by seq & 1: a peer that finished a
// one-barrier collective may publish the next before this rank read the
// current. With two ranks or more an empty collective publishes and passes
// one barrier too, so a rank with an empty tensor cannot run a collective
// ahead. Cost: one line written and world - 1 read per collective, nothing
// per chunk.
//
// Waiting spins briefly, then sleeps on a futex in the segment that every
// arrival bumps and wakes, so a waiting rank costs no CPU (its compute
// threads keep the cores) and still wakes within microseconds of the last
// arrival. Collectives run one at a time, in call order, on a communicator
// thread.
//
// Bucket memory (AllocateBucketMemory): a second kind of shared memory,
// one memfd *region* per call, holding one buffer per rank, every rank
// mapping all of them. The Reducer puts its gradient buckets there. An
// allreduce of a tensor inside a region needs no staging slots: once every
// rank has arrived (its bucket is final), each rank reduces its 1/world of
// the elements straight from the peers' buffers and writes the result into
// every buffer, and a second barrier ends it. Per rank that is one read and
// one write of the bucket, against a copy in, a reduction and a copy out
// through the slots. Each rank publishes in its control line where its
// tensor is (region, offset; its bytes, dtype and op are the call's, see
// "Agreement"); a rank that finds the others disagree (one in a region, one
// not, or different offsets) fails the collective with both placements
// named instead of reading the wrong bytes.
// Regions are created like the segment (rank 0's memfd, opened by the others
// through /proc, checked by nonce), over the store under
// "<key_prefix>/region/<k>"; every rank reports whether it mapped the region
// and all use it only if all did. A region goes when the last tensor in it
// does (on every rank).
//
// Errors: a rank that does not reach a barrier within the collective's
// timeout is named, with the collective it last entered ("shm allreduce #12
// on rank 0: ranks [2] did not arrive within 3 s (rank 2 last entered
// allgather #11)"); a rank whose process has exited is named at once,
// without waiting for the timeout ("rank 1 (pid 4242) exited"). A rank that
// gives up says so in its control line before anything else, and a peer
// fails at once on seeing it: one arriving at a barrier the rank was
// counted at, or waiting for that rank at a later one, with Aborted ("rank
// 0 gave up on it first, waiting for rank 2"), blaming the rank that one
// blamed (none when it waited for this rank); one waiting at the barrier
// for the same ranks the other gave up on, with the DeadlineExceeded its
// own timeout would have given ("ranks [2] did not arrive (rank 2 last
// entered allreduce #0); rank 0 gave up on it first, waiting for rank 2").
// Either way the communicator is broken and every later call fails with
// FailedPrecondition, as with Gloo.
//
// Thread safety: thread-safe (see Communicator). The destructor lets queued
// collectives finish (each bounded by its timeout) and joins the thread.
#ifndef LOCKSTEP_DDP_SHM_COMMUNICATOR_H_
#define LOCKSTEP_DDP_SHM_COMMUNICATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "ddp/collective_queue.h"
#include "ddp/communicator.h"
#include "ddp/missing_ranks.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace ddp {

// Bytes of shared memory per rank (two halves of 2 MB). 4 MB per rank keeps
// a chunk inside the caches of common server cores while amortising the two
// barriers per chunk.
inline constexpr size_t kDefaultShmSlotBytes = 4u << 20;

struct ShmOptions {
  // End-to-end timeout of every collective. Default: kDefaultCollectiveTimeout.
  Duration timeout = kDefaultCollectiveTimeout;
  // How long Create waits for rank 0's segment and for every rank to attach.
  // Default: rendezvous::kDefaultStoreTimeout.
  Duration connect_timeout = rendezvous::kDefaultStoreTimeout;
  // Store key prefix; communicators sharing a store namespace need distinct
  // prefixes. Default: "shm".
  std::string key_prefix = "shm";
  // Shared memory per rank, rounded up to a multiple of 128 bytes; at least
  // 128. Every rank must pass the same value (checked).
  size_t slot_bytes = kDefaultShmSlotBytes;
  // The host name this rank reports; empty: gethostname(). Ranks must all
  // report rank 0's. (Tests set it to simulate a second host.)
  std::string hostname;
  // Told every few seconds whom the bootstrap still waits for. Default: none
  // (InitFromEnv logs it).
  ProgressLog progress;
  // This communicator's ranks as the job's, for the lost-peer mark.
  // Default: the identity (a communicator over the whole job).
  RankMap global_ranks;
  // A collective that fails blaming a peer carries that peer's global rank
  // as kLostPeerPayload (missing_ranks.h), for the HierarchicalCommunicator
  // built over this one, which consumes it. Default: false (a payload would
  // show in every printed error).
  bool blame_payload = false;
};

class ShmCommunicator : public Communicator {
 public:
  // Creates (rank 0) or maps (others) the job's segment. Blocks until every
  // rank is attached or `connect_timeout` passes. Errors: InvalidArgument
  // (rank/world/slot size), FailedPrecondition (a rank on another host; the
  // message names both hosts), DeadlineExceeded (rank 0 never published the
  // segment, or the ranks that never attached, named), Internal
  // (memfd_create, ftruncate or mmap failed, with errno's text). `store` must outlive the
  // communicator.
  static StatusOr<std::unique_ptr<ShmCommunicator>> Create(rendezvous::Store* store, int rank,
                                                          int world_size, ShmOptions options = {});
  ~ShmCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "shm"; }

  // Float, double, float16, bfloat16, int32 and int64; kAvg on floating
  // dtypes only.
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> AllGather(at::Tensor input, at::Tensor output) override;
  std::shared_ptr<Work> Barrier() override;
  // A region of `numel` zeroed elements per rank (see "Bucket memory").
  // Blocks until every rank has mapped it (or reported it could not): each
  // of its two waits (rank 0's memfd, every rank's verdict) is bounded by
  // connect_timeout. Undefined (ordinary memory, then) when a rank
  // could not create or map it.
  StatusOr<at::Tensor> AllocateBucketMemory(int64_t numel, at::ScalarType dtype) override;
  bool FusedAverage() const override { return true; }
  // A float32 tensor in bucket memory, with two ranks or more: the slice
  // this rank reduces (see "Bucket memory"). Otherwise none.
  std::pair<int64_t, int64_t> OwnShare(const at::Tensor& tensor) const override;
  // In bucket memory (float32), the pieces inside this rank's slice are read
  // in place by the reduction, once; the rest are copied in before the
  // first barrier. Elsewhere all are copied in first.
  std::shared_ptr<Work> AllReduceFrom(at::Tensor tensor, ReduceOp op,
                                      std::vector<InputPiece> pieces) override;
  // AllReduceFrom's sum divided by `divisor` (at least 1; not 1 only for
  // floating dtypes) in the same pass: kAvg is the divisor world_size().
  // HierarchicalCommunicator's host step, where the divisor is the whole
  // world's size: every host's sum divided by it adds up, between hosts, to
  // the world's average, with no pass of its own.
  std::shared_ptr<Work> AllReduceDividedFrom(at::Tensor tensor, double divisor,
                                             std::vector<InputPiece> pieces);
  // Allreduces this rank ran in place in bucket memory (not through the
  // slots), for tests.
  uint64_t in_place_allreduces() const { return in_place_allreduces_.load(); }
  // Elements of AllReduceFrom's pieces the reductions read in place (not
  // copied in first), for tests.
  uint64_t elements_read_from_pieces() const { return elements_read_from_pieces_.load(); }

  struct Segment;  // The mapping (shm_communicator.cc).
  struct Region;   // A bucket-memory region (shm_communicator.cc).
  struct Call;     // What a collective is, as the ranks compare it (shm_communicator.cc).

 private:
  ShmCommunicator(rendezvous::Store* store, int rank, int world_size, ShmOptions options,
                  std::unique_ptr<Segment> segment);

  // Queues `body` with the collective's deadline (timeout from its start).
  std::shared_ptr<Work> Enqueue(const char* name,
                                std::function<Status(uint64_t seq, MonoTime deadline)> body);

  // A collective's first barrier (see "Agreement"): publishes `call` in
  // this rank's call line, arrives, and fails with InvalidArgument unless
  // every peer published the same call at `seq`.
  Status Enter(uint64_t seq, const Call& call, MonoTime deadline);
  void Publish(uint64_t seq, const Call& call);
  // Entry `index` of `rank`'s call line; *seq gets its sequence number.
  Call EntryOf(int rank, size_t index, uint64_t* seq) const;
  // "rank 2 last entered allgather #6", for messages.
  std::string LastEntered(int rank) const;
  // The phase barrier: publishes the next phase and waits for every rank
  // (WaitForAll); fails when a rank gave up a collective meanwhile.
  Status Arrive(uint64_t seq, const char* name, MonoTime deadline);
  // Fails at once when a peer's process exited or a peer gave up (see
  // "Errors"), else at `deadline`; says it gave up (GiveUp) before building
  // the error, so that no peer passes a barrier it no longer waits at.
  Status WaitForAll(uint64_t seq, const char* name, MonoTime deadline);
  // Marks this rank as given up in its control line, blaming `blamed`
  // (-1: none), and wakes the peers asleep at a barrier.
  void GiveUp(int blamed);
  // This rank's failure after `peer` gave up (its control line's `gave_up`):
  // it gives up too and blames the rank `peer` blamed (none if itself).
  Status FollowGaveUp(uint64_t seq, const char* name, int peer, uint32_t gave_up);
  // "rank 0 gave up on it first, waiting for rank 2", for messages.
  std::string GaveUpText(uint64_t seq, int peer, uint32_t gave_up) const;
  // The half of every slot the next chunk uses (alternates).
  size_t NextHalf();
  uint8_t* HalfOf(int rank, size_t half) const;

  // `pieces` (checked and sorted, see AllReduceFrom) may be empty.
  Status RunAllReduce(const at::Tensor& tensor, double divisor,
                      const std::vector<InputPiece>& pieces, uint64_t seq, MonoTime deadline);
  // The allreduce of a tensor in `region`, at `offset` bytes into this
  // rank's buffer (see "Bucket memory"), after the first barrier. This
  // rank's input for its slice comes from `pieces` where they cover it
  // (sorted, disjoint and inside the slice; float32 only, for other dtypes
  // `pieces` must be empty).
  void ReduceInRegion(const Region& region, const at::Tensor& tensor, size_t offset, double divisor,
                      const std::vector<InputPiece>& pieces);
  // This rank's slice [lo, hi) of a `numel`-element tensor in bucket memory.
  std::pair<int64_t, int64_t> SliceOf(int64_t numel) const;
  // The region holding all of `tensor` in this rank's buffer, or null.
  std::shared_ptr<Region> RegionOf(const at::Tensor& tensor, size_t* offset) const;
  // After Enter: InvalidArgument unless every rank published the same
  // placement (region, offset) as this one.
  Status CheckPlacements(uint64_t seq, const Call& call) const;
  Status RunBroadcast(const at::Tensor& tensor, int root, uint64_t seq, MonoTime deadline);
  Status RunAllGather(const at::Tensor& input, const at::Tensor& output, uint64_t seq,
                      MonoTime deadline);

  rendezvous::Store* const store_;
  const int rank_;
  const int world_size_;
  const ShmOptions options_;
  std::unique_ptr<Segment> segment_;
  // Regions handed out and not yet gone (RegionOf looks them up from the
  // communicator thread; AllocateBucketMemory adds them).
  mutable std::mutex regions_mu_;
  std::vector<std::weak_ptr<Region>> regions_;  // GUARDED_BY(regions_mu_)
  uint64_t regions_made_ = 0;                   // GUARDED_BY(regions_mu_)
  std::atomic<uint64_t> in_place_allreduces_{0};
  std::atomic<uint64_t> elements_read_from_pieces_{0};
  // Used only on the communicator thread.
  uint64_t phase_ = 0;
  uint64_t chunks_ = 0;
  // Last: destroyed first, so its thread stops before the segment goes.
  CollectiveQueue queue_{"shm"};
};

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_SHM_COMMUNICATOR_H_
