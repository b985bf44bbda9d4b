#include "ddp/comm_hook.h"

#include <ATen/ATen.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace ddp {

std::shared_ptr<BucketWork> BucketWork::Of(std::shared_ptr<Work> work, at::Tensor result,
                                           int64_t wire_bytes) {
  return std::shared_ptr<BucketWork>(
      new BucketWork(std::move(work), std::move(result), nullptr, wire_bytes, false));
}

std::shared_ptr<BucketWork> BucketWork::Then(std::shared_ptr<Work> work, Continuation then,
                                             int64_t wire_bytes) {
  return std::shared_ptr<BucketWork>(
      new BucketWork(std::move(work), at::Tensor(), std::move(then), wire_bytes, false));
}

std::shared_ptr<BucketWork> BucketWork::ThenOnHost(std::shared_ptr<Work> work, Continuation then,
                                                   int64_t wire_bytes) {
  return std::shared_ptr<BucketWork>(
      new BucketWork(std::move(work), at::Tensor(), std::move(then), wire_bytes, true));
}

std::shared_ptr<BucketWork> BucketWork::Failed(Status status) {
  return Of(Work::Failed(std::move(status)), at::Tensor(), 0);
}

StatusOr<at::Tensor> BucketWork::Wait(Duration timeout) {
  if (!waited_) {
    waited_ = true;
    status_ = host_wait_ ? work_->Wait(timeout) : work_->WaitStream(timeout);
    if (status_.ok() && then_) {
      try {
        StatusOr<at::Tensor> r = then_();
        if (r.ok()) {
          result_ = *std::move(r);
        } else {
          status_ = r.status();
        }
      } catch (const std::exception& e) {
        status_ = absl::InternalError(absl::StrCat("comm hook continuation threw: ", e.what()));
      }
    }
  }
  if (!status_.ok()) return status_;
  return result_;
}

CommHook AllreduceHook() {
  CommHook hook;
  hook.name = "allreduce";
  // The 1/world of the average rides on the copy into the bucket (one pass
  // over the gradients instead of two), and the wire carries a plain sum;
  // or, where the communicator divides while it reduces (FusedAverage), on
  // the reduction.
  hook.prescale_by_world = true;
  hook.prescale_optional = true;
  hook.takes_deferred_inputs = true;
  hook.sums_weighted_buckets = true;
  hook.run = [](GradBucket& bucket, Communicator& comm) {
    const ReduceOp op = bucket.prescaled || bucket.weighted ? ReduceOp::kSum : ReduceOp::kAvg;
    std::shared_ptr<Work> work =
        bucket.deferred_inputs.empty()
            ? comm.AllReduce(bucket.buffer, op)
            : comm.AllReduceFrom(bucket.buffer, op, std::move(bucket.deferred_inputs));
    return BucketWork::Of(std::move(work), bucket.buffer,
                          static_cast<int64_t>(bucket.buffer.nbytes()));
  };
  return hook;
}

namespace {

// Average on a `wire` dtype wire. The bucket arrives divided by the world
// size (prescale_by_world, done in the bucket's own dtype), so the sum of
// the compressed values is the average and stays within `wire`'s range
// whenever the average does; summing first and dividing after could
// overflow float16 (max 65504) for a world of ranks with large gradients.
// The compressed copy is a fresh tensor each step (a hook holds no state:
// one CommHook value may serve several DDP objects at once).
CommHook CompressHook(const char* name, at::ScalarType wire) {
  CommHook hook;
  hook.name = name;
  hook.prescale_by_world = true;
  hook.run = [wire](GradBucket& bucket, Communicator& comm) -> std::shared_ptr<BucketWork> {
    at::Tensor buffer = bucket.buffer;
    if (buffer.scalar_type() == wire) {
      return BucketWork::Of(comm.AllReduce(buffer, ReduceOp::kSum), buffer,
                            static_cast<int64_t>(buffer.nbytes()));
    }
    at::Tensor compressed = buffer.to(wire);
    auto work = comm.AllReduce(compressed, ReduceOp::kSum);
    return BucketWork::Then(
        std::move(work),
        [buffer, compressed]() -> StatusOr<at::Tensor> {
          buffer.copy_(compressed);
          return buffer;
        },
        static_cast<int64_t>(compressed.nbytes()));
  };
  return hook;
}

struct Dots {
  double ab = 0, aa = 0, bb = 0;
};

template <typename T>
Dots CpuDots(const T* a, const T* b, int64_t n) {
  Dots d;
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    d.ab += x * y;
    d.aa += x * x;
    d.bb += y * y;
  }
  return d;
}

// The CPU's float and double tensors, laid out flat: a loop in double.
bool HostLoop(const at::Tensor& a, const at::Tensor& b) {
  return a.is_cpu() && b.is_cpu() && a.is_contiguous() && b.is_contiguous() &&
         a.scalar_type() == b.scalar_type() &&
         (a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble);
}

Dots HostDots(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kFloat) {
    return CpuDots(a.data_ptr<float>(), b.data_ptr<float>(), a.numel());
  }
  return CpuDots(a.data_ptr<double>(), b.data_ptr<double>(), a.numel());
}

double Coefficient(double dot, double norm2) { return norm2 > 0 ? 1.0 - dot / (2.0 * norm2) : 1.0; }

}  // namespace

void AdasumCombineInto(at::Tensor a, const at::Tensor& b) {
  if (HostLoop(a, b)) {
    const Dots d = HostDots(a, b);
    a.mul_(Coefficient(d.ab, d.aa)).add_(b, Coefficient(d.ab, d.bb));
    return;
  }
  // Elsewhere (a GPU; other dtypes, strided views) the same in tensor ops,
  // the dot products and coefficients kept where the tensors are: on a
  // device nothing waits for the stream (.item() would, three times per
  // parameter and pair).
  const at::Tensor x = a.reshape(-1).to(at::kDouble);
  const at::Tensor y = b.reshape(-1).to(at::kDouble);
  const at::Tensor ab = x.dot(y);
  auto coefficient = [&ab](const at::Tensor& norm2) {
    return at::where(norm2 > 0, 1.0 - ab / (2.0 * norm2), at::ones_like(norm2));
  };
  const at::Tensor ca = coefficient(x.dot(x)).to(a.scalar_type());
  const at::Tensor cb = coefficient(y.dot(y)).to(b.scalar_type());
  a.mul_(ca).add_(b * cb);
}

void AdasumTreeInPlace(at::Tensor grads) {
  const int64_t world = grads.size(0);
  int64_t pow2 = 1;
  while (pow2 * 2 <= world) pow2 *= 2;
  // Remainder ranks fold into their partners first...
  for (int64_t r = pow2; r < world; ++r) AdasumCombineInto(grads[r - pow2], grads[r]);
  // ...then the power-of-two tree: distance 1, 2, 4, ...
  for (int64_t d = 1; d < pow2; d *= 2) {
    for (int64_t i = 0; i + d < pow2; i += 2 * d) AdasumCombineInto(grads[i], grads[i + d]);
  }
}

// Adasum over an allgather: every rank receives every rank's bucket
// ([world, numel], rank order) and computes the same tree per parameter,
// so every rank ends with the same result, bit for bit. Cost against
// Horovod's recursive halving (which needs point-to-point sends the
// Communicator does not offer): each rank receives (world - 1) x the bucket
// instead of about 2x, holds world x the bucket, and computes all world - 1
// combinations instead of its share; fine for a few ranks on one host, the
// wrong choice for a large world.
CommHook AdasumHook() {
  CommHook hook;
  hook.name = "adasum";
  hook.prescale_by_world = false;  // Adasum combines the ranks' own gradients.
  hook.run = [](GradBucket& bucket, Communicator& comm) -> std::shared_ptr<BucketWork> {
    const int64_t world = comm.world_size();
    at::Tensor buffer = bucket.buffer;
    const int64_t numel = buffer.numel();
    at::Tensor gathered = at::empty({world * numel}, buffer.options());
    std::shared_ptr<Work> work = comm.AllGather(buffer, gathered);
    std::vector<int64_t> offsets = bucket.offsets;
    std::vector<int64_t> numels = bucket.numels;
    // On the host: a gather that fails after the stream order was taken
    // (a peer lost, the rows half written once the communicator aborts)
    // must not be combined.
    return BucketWork::ThenOnHost(
        std::move(work),
        [buffer, gathered, world, numel, offsets, numels]() -> StatusOr<at::Tensor> {
          at::Tensor rows = gathered.view({world, numel});
          for (size_t k = 0; k < offsets.size(); ++k) {
            AdasumTreeInPlace(rows.narrow(1, offsets[k], numels[k]));
          }
          buffer.copy_(rows[0]);
          return buffer;
        },
        static_cast<int64_t>(buffer.nbytes()));
  };
  return hook;
}

CommHook Fp16CompressHook() { return CompressHook("fp16", at::kHalf); }
CommHook Bf16CompressHook() { return CompressHook("bf16", at::kBFloat16); }

StatusOr<CommHook> CommHookFromName(const std::string& name) {
  if (name == "allreduce") return AllreduceHook();
  if (name == "fp16") return Fp16CompressHook();
  if (name == "bf16") return Bf16CompressHook();
  if (name == "adasum") return AdasumHook();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown comm hook '", name, "' (choices: allreduce, fp16, bf16, adasum)"));
}

}  // namespace ddp
}  // namespace lockstep
