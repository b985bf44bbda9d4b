// A small two-layer net and its batches, shared by the engine tests that
// train ranks as threads and compare them with one process
// (comm_hook_test, sample_weighting_test). Test-only.
#ifndef LOCKSTEP_DDP_TEST_NET_H_
#define LOCKSTEP_DDP_TEST_NET_H_

#include <torch/torch.h>

#include <vector>

namespace lockstep {
namespace ddp {
namespace test_net {

inline constexpr int64_t kNetIn = 6;
inline constexpr int64_t kNetHidden = 8;
inline constexpr int64_t kNetOut = 3;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kNetIn, kNetHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kNetHidden, kNetOut));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

struct Batch {
  torch::Tensor x, y;
};
// data[rank][step or micro-batch]; made on the calling thread (torch's
// generator is global).
using Data = std::vector<std::vector<Batch>>;

// A net with `from`'s parameters.
inline Net Replica(const Net& from) {
  Net net;
  torch::NoGradGuard no_grad;
  auto src = from->parameters();
  auto dst = net->parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  return net;
}

}  // namespace test_net
}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_TEST_NET_H_
