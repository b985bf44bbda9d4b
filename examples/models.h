// The benchmark workloads, defined as in ../shared/bench/torch_ddp_bench.py
// (the peer script), plus small models of the same families for tests.
//
//   mlp          ~38M params: 1024-4096-4096-4096-10, ReLU.
//   convnet      small ResNet-like CNN on 3x32x32 with BatchNorm.
//   transformer  6 encoder layers, d=256, 4 heads, ff 1024, seq 32, dropout
//                0.1 (LibTorch 1.13's encoder layer has no batch_first; the
//                module transposes, which is the same computation).
//   deep_mlp     ~35M params: 256, then 8 layers of 2048x2048, then 10;
//                ReLU. Not in the peer script: equal layers whose gradients
//                arrive faster than Gloo reduces them (gradient priority).
//   mlp_small, transformer_small (dropout 0), tied (embedding and output
//   projection share one weight), unused (a branch not used in forward).
#ifndef LOCKSTEP_EXAMPLES_MODELS_H_
#define LOCKSTEP_EXAMPLES_MODELS_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace examples {

struct Workload {
  torch::nn::AnyModule module;
  std::shared_ptr<torch::nn::Module> root;
  std::vector<int64_t> input_shape;  // Per sample.
  bool integer_input = false;        // Token ids in [0, vocab) instead of floats.
  int64_t vocab = 0;
};

// Seeds torch with `seed` and builds the named model (see file comment).
// Errors: InvalidArgument for an unknown name.
StatusOr<Workload> MakeWorkload(const std::string& name, uint64_t seed = 0);
// OK when MakeWorkload knows `name`; its InvalidArgument otherwise (without
// building anything: checked before a rank connects).
Status CheckModelName(const std::string& name);

// The synthetic global batch: `total` samples (inputs, class labels in
// [0, 10)), generated from `seed`; rank r trains on rows [r*b, (r+1)*b).
std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Workload& w, int64_t total, uint64_t seed);

}  // namespace examples
}  // namespace lockstep

#endif  // LOCKSTEP_EXAMPLES_MODELS_H_
