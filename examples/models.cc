#include "examples/models.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace examples {
namespace {

namespace nn = torch::nn;

// nn::Sequential with a concrete forward, so it fits in an AnyModule.
struct NetImpl : nn::SequentialImpl {
  using nn::SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return nn::SequentialImpl::forward(x); }
};
TORCH_MODULE(Net);

Net Block(int64_t in, int64_t out) {
  return Net(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1)),
             nn::BatchNorm2d(out), nn::ReLU());
}

// Encoder over (batch, seq, d) inputs, flattened into a linear classifier.
struct TransformerNetImpl : nn::Module {
  TransformerNetImpl(int64_t d, int64_t heads, int64_t ff, int64_t layers, int64_t seq,
                     double dropout) {
    auto layer = nn::TransformerEncoderLayer(
        nn::TransformerEncoderLayerOptions(d, heads).dim_feedforward(ff).dropout(dropout));
    encoder = register_module("encoder",
                              nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, layers)));
    head = register_module("head", nn::Linear(d * seq, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = encoder(x.transpose(0, 1)).transpose(0, 1);
    return head(x.flatten(1));
  }
  nn::TransformerEncoder encoder{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(TransformerNet);

// A module that registers a weight owned elsewhere (a tied weight).
struct TiedProjectionImpl : nn::Module {
  explicit TiedProjectionImpl(torch::Tensor w) { weight = register_parameter("weight", w); }
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedProjection);

// Token ids (batch, 8) -> embedding -> hidden -> logits over 10 classes
// through the embedding's (tied) weight restricted to the first 10 rows.
struct TiedNetImpl : nn::Module {
  TiedNetImpl() {
    embedding = register_module("embedding", nn::Embedding(64, 32));
    hidden = register_module("hidden", nn::Linear(32, 32));
    projection = register_module("projection", TiedProjection(embedding->weight));
  }
  torch::Tensor forward(torch::Tensor ids) {
    auto h = torch::relu(hidden(embedding(ids).mean(1)));
    return projection(h).narrow(1, 0, 10);
  }
  nn::Embedding embedding{nullptr};
  nn::Linear hidden{nullptr};
  TiedProjection projection{nullptr};
};
TORCH_MODULE(TiedNet);

// `unused` never takes part in forward.
struct UnusedBranchNetImpl : nn::Module {
  UnusedBranchNetImpl() {
    used = register_module("used", nn::Linear(16, 32));
    unused = register_module("unused", nn::Linear(16, 32));
    out = register_module("out", nn::Linear(32, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return out(torch::relu(used(x))); }
  nn::Linear used{nullptr}, unused{nullptr}, out{nullptr};
};
TORCH_MODULE(UnusedBranchNet);

template <typename M>
Workload Make(M module, std::vector<int64_t> shape) {
  Workload w;
  w.root = module.ptr();
  w.module = nn::AnyModule(module);
  w.input_shape = std::move(shape);
  return w;
}

}  // namespace

StatusOr<Workload> MakeWorkload(const std::string& name, uint64_t seed) {
  torch::manual_seed(seed);
  if (name == "mlp") {
    return Make(Net(nn::Linear(1024, 4096), nn::ReLU(), nn::Linear(4096, 4096),
                               nn::ReLU(), nn::Linear(4096, 4096), nn::ReLU(),
                               nn::Linear(4096, 10)),
                {1024});
  }
  if (name == "deep_mlp") {
    // Many equal layers, so gradients come faster than Gloo reduces them and
    // buckets queue on the wire: the case gradient priority is for.
    Net net;
    net->push_back(nn::Linear(256, 2048));
    net->push_back(nn::ReLU());
    for (int i = 0; i < 8; ++i) {
      net->push_back(nn::Linear(2048, 2048));
      net->push_back(nn::ReLU());
    }
    net->push_back(nn::Linear(2048, 10));
    return Make(net, {256});
  }
  if (name == "mlp_small") {
    return Make(Net(nn::Linear(64, 256), nn::ReLU(), nn::Linear(256, 256), nn::ReLU(),
                               nn::Linear(256, 256), nn::ReLU(), nn::Linear(256, 10)),
                {64});
  }
  if (name == "convnet") {
    return Make(Net(Block(3, 64), Block(64, 128), nn::MaxPool2d(2), Block(128, 128),
                               Block(128, 256), nn::MaxPool2d(2), Block(256, 256),
                               nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(256, 10)),
                {3, 32, 32});
  }
  if (name == "transformer") return Make(TransformerNet(256, 4, 1024, 6, 32, 0.1), {32, 256});
  if (name == "transformer_small") return Make(TransformerNet(32, 4, 64, 2, 8, 0.0), {8, 32});
  if (name == "tied") {
    Workload w = Make(TiedNet(), {8});
    w.integer_input = true;
    w.vocab = 64;
    return w;
  }
  if (name == "unused") return Make(UnusedBranchNet(), {16});
  RETURN_IF_ERROR(CheckModelName(name));
  return absl::InternalError(absl::StrCat("model '", name, "' is listed but not built"));
}

Status CheckModelName(const std::string& name) {
  static const char* const kNames[] = {"mlp",      "convnet",           "transformer", "deep_mlp",
                                       "mlp_small", "transformer_small", "tied",        "unused"};
  for (const char* known : kNames) {
    if (name == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "' (", absl::StrJoin(kNames, ", "), ")"));
}

std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Workload& w, int64_t total,
                                                  uint64_t seed) {
  torch::manual_seed(seed + 1);
  std::vector<int64_t> shape = {total};
  shape.insert(shape.end(), w.input_shape.begin(), w.input_shape.end());
  torch::Tensor x = w.integer_input ? torch::randint(0, w.vocab, shape, torch::kLong)
                                    : torch::randn(shape);
  torch::Tensor y = torch::randint(0, 10, {total}, torch::kLong);
  return {x, y};
}

}  // namespace examples
}  // namespace lockstep
