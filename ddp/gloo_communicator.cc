#include "ddp/gloo_communicator.h"

#ifdef LOCKSTEP_WITHOUT_GLOO
// A build without Gloo (the CMake build where no Gloo was found): the gloo
// and shm+gloo backends fail at Create, saying why.
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace ddp {
namespace {

Status GlooMissing() {
  return absl::UnimplementedError(
      "gloo: this build has no Gloo (ddp/CMakeLists.txt found no gloo/rendezvous/context.h "
      "and libgloo: install Debian's libgloo-dev or pass -DGLOO_ROOT); use the shm or nccl "
      "backend");
}

}  // namespace

StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(rendezvous::Store*, int, int,
                                                                   GlooOptions) {
  return GlooMissing();
}
GlooCommunicator::~GlooCommunicator() = default;
std::shared_ptr<Work> GlooCommunicator::AllReduce(at::Tensor, ReduceOp) {
  return Work::Failed(GlooMissing());
}
std::shared_ptr<Work> GlooCommunicator::Broadcast(at::Tensor, int) {
  return Work::Failed(GlooMissing());
}
std::shared_ptr<Work> GlooCommunicator::AllGather(at::Tensor, at::Tensor) {
  return Work::Failed(GlooMissing());
}
std::shared_ptr<Work> GlooCommunicator::Barrier() { return Work::Failed(GlooMissing()); }

}  // namespace ddp
}  // namespace lockstep

#else  // LOCKSTEP_WITHOUT_GLOO

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <signal.h>

#include <algorithm>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/worker_link.h"
#include "ddp/missing_ranks.h"

namespace lockstep {
namespace ddp {
namespace {

using Millis = std::chrono::milliseconds;

Millis ToMillis(Duration d) {
  return std::max(Millis(1), std::chrono::duration_cast<Millis>(d));
}

// gloo::rendezvous::Store over our Store, under a key prefix. Gloo expects
// failures as exceptions; they are caught in GlooCommunicator::Create.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(rendezvous::Store* store, std::string prefix, Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_->Set(Key(key), std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->Get(Key(key), timeout_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToMillis(timeout_)); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(Key(k));
    Status s = store_->Wait(full, timeout);
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  rendezvous::Store* store_;
  std::string prefix_;
  Duration timeout_;
};

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// Gloo's reduce function for the half-precision dtypes (Gloo has none for
// bfloat16, and its float16 is another type than c10::Half): each sum is
// computed in float and rounded to T.
template <typename T>
void HalfSum(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
  }
}

template <typename T>
ReduceFn SumFunction() {
  if constexpr (std::is_same<T, c10::Half>::value || std::is_same<T, c10::BFloat16>::value) {
    return &HalfSum<T>;
  } else {
    return static_cast<ReduceFn>(&gloo::sum<T>);
  }
}

template <typename T>
void RunAllReduce(const std::shared_ptr<gloo::Context>& ctx, at::Tensor& t, Millis timeout,
                  uint32_t tag, size_t max_segment_bytes) {
  gloo::AllreduceOptions opts(ctx);
  if (max_segment_bytes > 0) opts.setMaxSegmentSize(max_segment_bytes);
  opts.setOutput(t.data_ptr<T>(), static_cast<size_t>(t.numel()));
  opts.setReduceFunction(SumFunction<T>());
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

template <typename T>
void DivideInPlace(at::Tensor& t, int world_size) {
  T* p = t.data_ptr<T>();
  const T inv = T(1) / static_cast<T>(world_size);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

}  // namespace

namespace {

// The first words of every rank's entry in the mesh check.
constexpr int64_t kMeshMagic = 0x6c6f636b73746570;  // "lockstep"
// The mesh check's tag: far from the collectives' sequence numbers.
constexpr uint32_t kMeshCheckTag = 0x7fff0000;

// A write to a socket whose peer has gone raises SIGPIPE, which kills the
// process by default: Gloo writes with writev, without MSG_NOSIGNAL. With
// SIGPIPE ignored the write fails with EPIPE, Gloo throws, and the Work's
// error names the lost peer. A handler the program installed is kept.
void IgnoreSigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    (void)signal(SIGPIPE, SIG_IGN);
  }
}

// One attempt at the full mesh under `mesh` (a store key prefix), checked:
// an allgather over every pair must return each rank's own entry
// {magic, rank, world, nonce}. Returns the context, or null with *error.
std::shared_ptr<gloo::rendezvous::Context> ConnectCheckedMesh(rendezvous::Store* store, int rank,
                                                              int world_size,
                                                              const GlooOptions& options,
                                                              const std::string& mesh,
                                                              std::string* error) {
  try {
    std::string nonce_text;
    if (rank == 0) {
      std::random_device random;
      nonce_text = std::to_string((uint64_t{random()} << 32) ^ random());
      Status s = store->Set(mesh + "/nonce", nonce_text);
      if (!s.ok()) throw gloo::IoException(std::string(s.message()));
    } else {
      auto v = store->Get(mesh + "/nonce", options.connect_timeout);
      if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
      nonce_text = *v;
    }
    const int64_t nonce = static_cast<int64_t>(std::stoull(nonce_text));
    GlooStoreAdapter adapter(store, mesh, options.connect_timeout);
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(ToMillis(options.connect_timeout));
    context->connectFullMesh(adapter, device);
    if (world_size == 1) return context;
    std::vector<int64_t> mine = {kMeshMagic, rank, world_size, nonce};
    std::vector<int64_t> all(mine.size() * world_size);
    gloo::AllgatherOptions check(context);
    check.setInput(mine.data(), mine.size());
    check.setOutput(all.data(), all.size());
    check.setTag(kMeshCheckTag);
    check.setTimeout(ToMillis(std::min<Duration>(options.connect_timeout, kMeshCheckTimeout)));
    gloo::allgather(check);
    for (int r = 0; r < world_size; ++r) {
      const int64_t* got = &all[r * mine.size()];
      if (got[0] != kMeshMagic || got[1] != r || got[2] != world_size || got[3] != nonce) {
        *error = absl::StrCat("the pair to rank ", r, " carried {rank ", got[1], ", world ", got[2],
                              ", mesh ", got[3], "}, expected {rank ", r, ", world ", world_size,
                              ", mesh ", nonce, "}: a foreign or stray connection");
        return nullptr;
      }
    }
    return context;
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}

}  // namespace

StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(rendezvous::Store* store,
                                                                    int rank, int world_size,
                                                                    GlooOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("gloo: store is null");
  RETURN_IF_ERROR(CheckRank("gloo", rank, world_size));
  if (options.timeout <= Duration::zero()) {
    return absl::InvalidArgumentError("gloo: collective timeout must be positive");
  }
  IgnoreSigpipe();
  const std::string& prefix = options.key_prefix;
  const std::string who = absl::StrCat("gloo: rank ", rank);
  const std::string what =
      absl::StrCat(who, " connecting the mesh of ", world_size, " ranks on ", options.hostname);
  // Arrival first, so that no pair listens for a peer that is not there
  // yet, and the wait names whoever is missing.
  std::vector<std::pair<int, std::string>> arrived;
  for (int r = 0; r < world_size; ++r) arrived.emplace_back(r, absl::StrCat(prefix, "/arrived/", r));
  RETURN_IF_ERROR(Annotate(store->Set(arrived[rank].second, "1"), who + ": publishing arrival"));
  const Logger log = Logger("ddp").WithRank(rank);
  const ProgressLog progress = [log](const std::string& line) { log.Info("{}", line); };
  RETURN_IF_ERROR(WaitForRanks(store, arrived, options.connect_timeout, what, progress,
                               kBootstrapProgressInterval, options.global_ranks));

  std::string last_failure;
  for (int attempt = 0; attempt < kMaxMeshAttempts; ++attempt) {
    const std::string mesh = absl::StrCat(prefix, "/mesh", attempt);
    std::string error;
    auto context = ConnectCheckedMesh(store, rank, world_size, options, mesh, &error);
    // Every rank publishes its verdict; all retry if any failed, so the
    // ranks never disagree on which mesh they use.
    std::vector<std::pair<int, std::string>> verdicts;
    for (int r = 0; r < world_size; ++r) verdicts.emplace_back(r, absl::StrCat(mesh, "/verdict/", r));
    RETURN_IF_ERROR(Annotate(store->Set(verdicts[rank].second, error.empty() ? "ok" : error),
                             who + ": publishing its mesh check"));
    RETURN_IF_ERROR(WaitForRanks(store, verdicts, options.connect_timeout,
                                 absl::StrCat(who, " checking mesh attempt ", attempt + 1),
                                 progress, kBootstrapProgressInterval, options.global_ranks));
    std::vector<std::string> failures;
    for (const auto& [r, key] : verdicts) {
      auto verdict = store->Get(key, Duration::zero());
      if (verdict.ok() && *verdict != "ok") failures.push_back(absl::StrCat("rank ", r, ": ", *verdict));
    }
    if (failures.empty()) {
      return std::unique_ptr<GlooCommunicator>(
          new GlooCommunicator(store, rank, world_size, std::move(options), std::move(context)));
    }
    last_failure = absl::StrJoin(failures, "; ");
    log.Warn("{}: mesh attempt {} of {} failed ({}); connecting again", who, attempt + 1,
             kMaxMeshAttempts, last_failure);
  }
  return absl::UnavailableError(absl::StrCat(
      who, ": the mesh of ", world_size, " ranks failed its check ", kMaxMeshAttempts,
      " times (stray connections to its ports? see daemon/README.md); last: ", last_failure));
}

GlooCommunicator::GlooCommunicator(rendezvous::Store* store, int rank, int world_size,
                                   GlooOptions options, std::shared_ptr<gloo::Context> context)
    : store_(store),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      grace_(std::min<Duration>(options_.timeout / 5, kMaxDiagnosisGrace)),
      context_(std::move(context)) {
  context_->setTimeout(ToMillis(options_.timeout - grace_));
}

GlooCommunicator::~GlooCommunicator() = default;

std::shared_ptr<Work> GlooCommunicator::Enqueue(
    const char* name, std::function<void(Millis, uint32_t)> body) {
  return queue_.Enqueue(name, [this, name, body = std::move(body)](uint64_t seq) -> Status {
    try {
      body(ToMillis(options_.timeout - grace_), static_cast<uint32_t>(seq));
    } catch (const gloo::IoException& e) {
      // A peer's connection failed or timed out.
      CloseConnections();
      return Diagnose(seq, name, e.what());
    } catch (const std::exception& e) {
      // This rank's own failure (a size mismatch Gloo enforces, memory):
      // no peer is lost, so none is named, and this rank's exit is the
      // cause the coordinator records.
      CloseConnections();
      return absl::InternalError(absl::StrCat("gloo ", name, " #", seq, " on rank ", rank_,
                                              " failed here, not for a peer: ", e.what()));
    }
    return absl::OkStatus();
  });
}

void GlooCommunicator::CloseConnections() {
  // Gloo closes only the connection that failed; a ring's other ranks wait
  // on this one over theirs until their own timeout, too late to write
  // their diagnosis, and would be named as not arriving. Closed, each
  // fails at once and says so (Gloo does the same on its own timeout). The
  // queue refuses everything after this failure, so nothing uses them again.
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    try {
      auto& pair = context_->getPair(peer);
      if (pair) pair->close();
    } catch (const std::exception&) {
      // Already broken: nothing to close.
    }
  }
}

Status GlooCommunicator::Diagnose(uint64_t seq, const char* name, const std::string& what) {
  Status store_error;
  const std::vector<int> missing =
      ReportAndFindMissing(store_, absl::StrCat(options_.key_prefix, "/failed/", seq, "/"), rank_,
                           world_size_, grace_, &store_error);
  // Either way a peer is gone or unreachable: this rank's failure follows
  // another's (the agent reads the mark when this worker exits).
  const std::string head = absl::StrCat("gloo ", name, " #", seq, " on rank ", rank_, " failed");
  if (!store_error.ok()) {
    return PeerLostError(
        absl::UnavailableError(absl::StrCat(head, " (gloo: ", what,
                                            "); the store could not tell which ranks reached it: ",
                                            store_error.message())),
        options_.global_ranks, -1, options_.blame_payload);
  }
  if (missing.empty()) {
    return PeerLostError(
        absl::UnavailableError(
            absl::StrCat(head, ": every rank reached it; transport error (gloo: ", what, ")")),
        options_.global_ranks, -1, options_.blame_payload);
  }
  return PeerLostError(
      absl::DeadlineExceededError(absl::StrCat(head, ": ranks ", FormatRanks(missing),
                                               " did not arrive within ",
                                               ToSeconds(options_.timeout), " s (gloo: ", what,
                                               ")")),
      options_.global_ranks, missing.front(), options_.blame_payload);
}

std::shared_ptr<Work> GlooCommunicator::AllReduce(at::Tensor tensor, ReduceOp op) {
  if (Status s = CheckCpuAllReduce(tensor, op); !s.ok()) return Work::Failed(s);
  const int world = world_size_;
  const auto dtype = tensor.scalar_type();
  return Enqueue("allreduce", [this, tensor, op, dtype, world](Millis timeout,
                                                               uint32_t tag) mutable {
    if (tensor.numel() == 0 || world == 1) return;
    switch (dtype) {
      case at::kFloat:
        RunAllReduce<float>(context_, tensor, timeout, tag, options_.max_segment_bytes);
        if (op == ReduceOp::kAvg) DivideInPlace<float>(tensor, world);
        break;
      case at::kDouble:
        RunAllReduce<double>(context_, tensor, timeout, tag, options_.max_segment_bytes);
        if (op == ReduceOp::kAvg) DivideInPlace<double>(tensor, world);
        break;
      case at::kHalf:
        RunAllReduce<c10::Half>(context_, tensor, timeout, tag, options_.max_segment_bytes);
        if (op == ReduceOp::kAvg) tensor.div_(world);
        break;
      case at::kBFloat16:
        RunAllReduce<c10::BFloat16>(context_, tensor, timeout, tag, options_.max_segment_bytes);
        if (op == ReduceOp::kAvg) tensor.div_(world);
        break;
      case at::kInt:
        RunAllReduce<int32_t>(context_, tensor, timeout, tag, options_.max_segment_bytes);
        break;
      default:
        RunAllReduce<int64_t>(context_, tensor, timeout, tag, options_.max_segment_bytes);
        break;
    }
  });
}

std::shared_ptr<Work> GlooCommunicator::Broadcast(at::Tensor tensor, int root) {
  Status s = CheckCollectiveTensor(tensor, "broadcast");
  if (s.ok()) s = CheckBroadcastRoot(root, world_size_);
  if (!s.ok()) return Work::Failed(s);
  return Enqueue("broadcast", [this, tensor, root](Millis timeout, uint32_t tag) mutable {
    const size_t bytes = tensor.nbytes();
    if (bytes == 0 || world_size_ == 1) return;
    gloo::BroadcastOptions opts(context_);
    auto* p = static_cast<uint8_t*>(tensor.data_ptr());
    if (rank_ == root) opts.setInput(p, bytes);
    opts.setOutput(p, bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> GlooCommunicator::AllGather(at::Tensor input, at::Tensor output) {
  if (Status s = CheckAllGather(input, output, world_size_); !s.ok()) return Work::Failed(s);
  return Enqueue("allgather", [this, input, output](Millis timeout, uint32_t tag) mutable {
    const size_t bytes = input.nbytes();
    if (bytes == 0) return;
    if (world_size_ == 1) {
      std::memcpy(output.data_ptr(), input.data_ptr(), bytes);
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(input.data_ptr()), bytes);
    opts.setOutput(static_cast<uint8_t*>(output.data_ptr()), bytes * world_size_);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allgather(opts);
  });
}

std::shared_ptr<Work> GlooCommunicator::Barrier() {
  return Enqueue("barrier", [this](Millis timeout, uint32_t tag) {
    if (world_size_ == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
}

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_WITHOUT_GLOO
