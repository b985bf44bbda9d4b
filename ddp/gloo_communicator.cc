#include "ddp/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

template <typename T>
void RunAllReduce(const std::shared_ptr<gloo::Context>& ctx, at::Tensor& t, Millis timeout,
                  uint32_t tag, size_t max_segment_bytes) {
  gloo::AllreduceOptions opts(ctx);
  if (max_segment_bytes > 0) opts.setMaxSegmentSize(max_segment_bytes);
  opts.setOutput(t.data_ptr<T>(), static_cast<size_t>(t.numel()));
  opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<T>));
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

StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(rendezvous::Store* store,
                                                                    int rank, int world_size,
                                                                    GlooOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("gloo: store is null");
  RETURN_IF_ERROR(CheckRank("gloo", rank, world_size));
  if (options.timeout <= Duration::zero()) {
    return absl::InvalidArgumentError("gloo: collective timeout must be positive");
  }
  GlooStoreAdapter adapter(store, options.key_prefix, options.connect_timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(ToMillis(options.connect_timeout));
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    // Name every rank whose address never appeared, not only the first.
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
      if (!store->Get(options.key_prefix + "/" + std::to_string(r), Duration::zero()).ok()) {
        missing.push_back(r);
      }
    }
    std::string msg = absl::StrCat("gloo: rank ", rank, " could not connect the mesh of ",
                                   world_size, " ranks");
    if (!missing.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat(msg, ": ranks ", FormatRanks(missing), " did not arrive within ",
                       ToSeconds(options.connect_timeout), " s (", e.what(), ")"));
    }
    return absl::UnavailableError(absl::StrCat(msg, ": ", e.what()));
  }
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(store, rank, world_size, std::move(options), std::move(context)));
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
    } catch (const std::exception& e) {
      return Diagnose(seq, name, e.what());
    }
    return absl::OkStatus();
  });
}

Status GlooCommunicator::Diagnose(uint64_t seq, const char* name, const std::string& what) {
  const std::vector<int> missing = ReportAndFindMissing(
      store_, absl::StrCat(options_.key_prefix, "/failed/", seq, "/"), rank_, world_size_, grace_);
  const std::string head = absl::StrCat("gloo ", name, " #", seq, " on rank ", rank_, " failed");
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat(head, ": ranks ", FormatRanks(missing), " did not arrive within ",
                     ToSeconds(options_.timeout), " s (gloo: ", what, ")"));
  }
  return absl::UnavailableError(
      absl::StrCat(head, ": every rank reached it; transport error (gloo: ", what, ")"));
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
