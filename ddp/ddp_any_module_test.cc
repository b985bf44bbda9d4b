// DistributedDataParallel with modules whose forward is not Tensor -> Tensor:
// tuple and dict outputs, several arguments, torch::nn::Sequential (typed and
// through a DistributedDataParallel*), find_unused_parameters with a tuple
// output. Two ranks run as threads over a FakeStore and real Gloo
// communicators; each DDP run is compared with one local model trained on
// the average of the ranks' losses (the union of their data).
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddp/ddp.h"
#include "ddp/fake_communicator.h"
#include "ddp/fake_store.h"
#include "ddp/test_ranks.h"
#include "gtest/gtest.h"

namespace lockstep {
namespace ddp {
namespace {

using torch::Tensor;

constexpr int kWorld = 2;
constexpr int kSteps = 4;
constexpr int64_t kRows = 4;  // Per rank and step.
constexpr int64_t kIn = 6;
constexpr int64_t kOut = 3;
constexpr double kTolerance = 1e-5;

// ---- Modules -------------------------------------------------------------

// (logits, aux): two heads over a shared trunk.
struct TupleNetImpl : torch::nn::Module {
  TupleNetImpl() {
    trunk = register_module("trunk", torch::nn::Linear(kIn, 8));
    head = register_module("head", torch::nn::Linear(8, kOut));
    aux = register_module("aux", torch::nn::Linear(8, 1));
  }
  std::tuple<Tensor, Tensor> forward(const Tensor& x) {
    Tensor h = torch::tanh(trunk(x));
    return {head(h), aux(h)};
  }
  torch::nn::Linear trunk{nullptr}, head{nullptr}, aux{nullptr};
};
TORCH_MODULE(TupleNet);

// Two inputs, one output.
struct TwoInputNetImpl : torch::nn::Module {
  TwoInputNetImpl() {
    a = register_module("a", torch::nn::Linear(kIn, kOut));
    b = register_module("b", torch::nn::Linear(kIn, kOut));
  }
  Tensor forward(Tensor x, Tensor z) { return a(x) * torch::sigmoid(b(z)); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoInputNet);

// A dict of tensors, each from its own branch.
struct DictNetImpl : torch::nn::Module {
  DictNetImpl() {
    left = register_module("left", torch::nn::Linear(kIn, kOut));
    right = register_module("right", torch::nn::Linear(kIn, kOut));
  }
  c10::Dict<std::string, Tensor> forward(const Tensor& x) {
    c10::Dict<std::string, Tensor> out;
    out.insert("left", left(x));
    out.insert("right", right(x));
    return out;
  }
  torch::nn::Linear left{nullptr}, right{nullptr};
};
TORCH_MODULE(DictNet);

// (main, aux): `aux` comes from its own branch only when use_aux (else it is
// undefined); `never` is never used.
struct BranchNetImpl : torch::nn::Module {
  BranchNetImpl() {
    main = register_module("main", torch::nn::Linear(kIn, kOut));
    side = register_module("side", torch::nn::Linear(kIn, 1));
    never = register_module("never", torch::nn::Linear(kIn, 1));
  }
  std::tuple<Tensor, Tensor> forward(const Tensor& x, bool use_aux) {
    return {main(x), use_aux ? side(x) : Tensor()};
  }
  torch::nn::Linear main{nullptr}, side{nullptr}, never{nullptr};
};
TORCH_MODULE(BranchNet);

torch::nn::Sequential MakeSequential() {
  return torch::nn::Sequential(torch::nn::Linear(kIn, 8), torch::nn::Tanh(),
                               torch::nn::Linear(8, kOut));
}

// ---- Harness -------------------------------------------------------------

struct Batch {
  Tensor x, z, y;
};

// data[step][rank], made on the calling thread (torch's generator is global).
std::vector<std::vector<Batch>> MakeData() {
  torch::manual_seed(7);
  std::vector<std::vector<Batch>> data(kSteps);
  for (auto& step : data) {
    for (int r = 0; r < kWorld; ++r) {
      step.push_back({torch::randn({kRows, kIn}), torch::randn({kRows, kIn}),
                      torch::randn({kRows, kOut})});
    }
  }
  return data;
}

// How a model's forward is reached in a training step: `forward(args...)`
// returns the module's output. LossFn(forward, batch, rank, step) -> loss of
// rank `rank` at `step` (a mean over its rows).
// Every model trains with `sgd` (plain SGD, lr 0.1, unless given).
template <typename ModuleType, typename LossFn>
void ExpectDdpMatchesLocal(std::function<ModuleType()> make, LossFn loss, DdpOptions options,
                           bool through_base = false,
                           torch::optim::SGDOptions sgd = torch::optim::SGDOptions(0.1)) {
  const auto data = MakeData();
  // Rank 1 starts elsewhere: DDP must broadcast rank 0's parameters.
  torch::manual_seed(1);
  ModuleType local = make();
  std::vector<ModuleType> replicas;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(r == 0 ? 1 : 2);
    replicas.push_back(make());
  }

  // Local: the average of the ranks' losses, one optimizer step per step.
  {
    torch::optim::SGD opt(local->parameters(), sgd);
    auto forward = [&](auto&&... args) {
      return local->forward(std::forward<decltype(args)>(args)...);
    };
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      Tensor total = torch::zeros({});
      for (int r = 0; r < kWorld; ++r) total = total + loss(forward, data[step][r], r, step);
      (total / kWorld).backward();
      opt.step();
    }
  }

  FakeStore store;
  std::vector<Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = [&]() -> Status {
        ASSIGN_OR_RETURN(auto comm, test_ranks::ConnectGloo(&store, rank, kWorld));
        DdpOptions opts = options;
        opts.timeout = std::chrono::seconds(30);
        ModuleType model = replicas[rank];
        ASSIGN_OR_RETURN(auto typed, DistributedDataParallel::Create(model, comm, opts));
        std::unique_ptr<DistributedDataParallel> base;
        if (through_base) base = std::move(typed);
        torch::optim::SGD opt(model->parameters(), sgd);
        Status forward_status;
        auto forward = [&](auto&&... args) {
          if constexpr (std::is_same<ModuleType, torch::nn::Sequential>::value) {
            if (base != nullptr) {
              auto out = base->Forward(std::forward<decltype(args)>(args)...);
              if (!out.ok()) throw std::runtime_error(out.status().ToString());
              return *std::move(out);
            }
          }
          auto out = typed->Forward(std::forward<decltype(args)>(args)...);
          if (!out.ok()) throw std::runtime_error(out.status().ToString());
          return *std::move(out);
        };
        for (int step = 0; step < kSteps; ++step) {
          opt.zero_grad();
          Tensor l;
          try {
            l = loss(forward, data[step][rank], rank, step);
          } catch (const std::exception& e) {
            return absl::InternalError(e.what());
          }
          RETURN_IF_ERROR(base != nullptr ? base->Backward(l) : typed->Backward(l));
          opt.step();
        }
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];

  const auto expected = local->named_parameters();
  for (int r = 0; r < kWorld; ++r) {
    for (const auto& p : replicas[r]->named_parameters()) {
      const Tensor& want = expected[p.key()];
      const Tensor& got = p.value();
      const double diff = (got - want).abs().max().item<double>();
      EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/kTolerance, /*atol=*/kTolerance))
          << "rank " << r << " parameter " << p.key() << " differs by " << diff;
    }
  }
}

// ---- Training ------------------------------------------------------------

TEST(DdpAnyModuleTest, TupleOutputTrainsLikeOneProcessOnTheUnion) {
  ExpectDdpMatchesLocal<TupleNet>(
      [] { return TupleNet(); },
      [](auto& forward, const Batch& b, int, int) {
        auto [logits, aux] = forward(b.x);
        return torch::mse_loss(logits, b.y) + 0.1 * aux.pow(2).mean();
      },
      DdpOptions{});
}

TEST(DdpAnyModuleTest, TwoArgumentForwardTrainsLikeOneProcessOnTheUnion) {
  ExpectDdpMatchesLocal<TwoInputNet>(
      [] { return TwoInputNet(); },
      [](auto& forward, const Batch& b, int, int) {
        Tensor out = forward(b.x, b.z);
        return torch::mse_loss(out, b.y);
      },
      DdpOptions{});
}

auto SequentialLoss = [](auto& forward, const Batch& b, int, int) {
  Tensor out = forward(b.x);
  return torch::mse_loss(out, b.y);
};

TEST(DdpAnyModuleTest, SequentialTrainsLikeOneProcessOnTheUnion) {
  ExpectDdpMatchesLocal<torch::nn::Sequential>(MakeSequential, SequentialLoss, DdpOptions{});
}

TEST(DdpAnyModuleTest, SequentialThroughBasePointerTrainsLikeOneProcessOnTheUnion) {
  ExpectDdpMatchesLocal<torch::nn::Sequential>(MakeSequential, SequentialLoss, DdpOptions{},
                                               /*through_base=*/true);
}

TEST(DdpAnyModuleTest, DictOutputTrainsLikeOneProcessOnTheUnion) {
  // find_unused_parameters: both dict values must be found, or the right
  // branch's gradients would be dropped as unused.
  DdpOptions options;
  options.find_unused_parameters = true;
  ExpectDdpMatchesLocal<DictNet>(
      [] { return DictNet(); },
      [](auto& forward, const Batch& b, int, int) {
        c10::Dict<std::string, Tensor> out = forward(b.x);
        return torch::mse_loss(out.at("left") + out.at("right"), b.y);
      },
      options);
}

TEST(DdpAnyModuleTest, FindUnusedWithTupleOutputAndABranchUnusedOnOneRank) {
  // Rank 0 uses the side branch (through the tuple's second element) on
  // even steps, rank 1 never does; `never` is unused everywhere, and so is
  // the side branch on odd steps. With weight decay and momentum a
  // parameter no rank used must get no gradient, as in one process, where
  // the optimizer skips it: a zero gradient would decay it and move it by
  // its momentum.
  DdpOptions options;
  options.find_unused_parameters = true;
  options.bucket_cap_mb = 0.0001;  // Several buckets.
  ExpectDdpMatchesLocal<BranchNet>(
      [] { return BranchNet(); },
      [](auto& forward, const Batch& b, int rank, int step) {
        const bool use_aux = rank == 0 && step % 2 == 0;
        auto [main, aux] = forward(b.x, use_aux);
        Tensor l = torch::mse_loss(main, b.y);
        if (aux.defined()) l = l + aux.pow(2).mean();
        return l;
      },
      options, /*through_base=*/false,
      torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.05));
}

// ---- Output types and the type-erased path (world of one) ----------------

TEST(DdpAnyModuleTest, CollectOutputTensorsFindsTensorsInNestedContainers) {
  Tensor t = torch::ones({1});
  c10::Dict<std::string, Tensor> dict;
  dict.insert("a", t);
  std::map<std::string, Tensor> map{{"m", t}};
  std::unordered_map<std::string, std::vector<Tensor>> umap{{"u", {t, t}}};
  c10::IValue ivalue = c10::ivalue::Tuple::create(
      {c10::IValue(t), c10::IValue(c10::List<Tensor>({t, t})), c10::IValue(3)});
  auto value = std::make_tuple(t, Tensor(), std::vector<Tensor>{t, t}, dict, map, umap,
                               std::make_pair(t, 1.5), c10::optional<Tensor>(t),
                               std::optional<Tensor>(), ivalue, std::string("s"), 42);
  std::vector<Tensor> out;
  CollectOutputTensors(value, &out);
  // 1 + 0 + 2 + 1 + 1 + 2 + 1 + 1 + 0 + 3.
  EXPECT_EQ(out.size(), 12u);
  for (const auto& o : out) EXPECT_TRUE(o.is_same(t));
}

// Two forward overloads: AnyModule cannot hold it, the typed object can.
struct OverloadedImpl : torch::nn::Module {
  OverloadedImpl() { fc = register_module("fc", torch::nn::Linear(kIn, kOut)); }
  Tensor forward(const Tensor& x) { return fc(x); }
  std::vector<Tensor> forward(const Tensor& x, int copies) {
    return std::vector<Tensor>(copies, fc(x));
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Overloaded);

TEST(DdpAnyModuleTest, OverloadedForwardWorksTypedAndIsRefusedThroughBasePointer) {
  auto comm = std::make_shared<FakeCommunicator>();
  auto model = Overloaded();
  auto ddp = DistributedDataParallel::Create(model, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto one = (*ddp)->Forward(torch::randn({2, kIn}));
  ASSERT_TRUE(one.ok()) << one.status();
  static_assert(std::is_same<decltype(one), StatusOr<Tensor>>::value);
  ASSERT_TRUE((*ddp)->Backward(one->sum()).ok());
  auto three = (*ddp)->Forward(torch::randn({2, kIn}), 3);
  ASSERT_TRUE(three.ok()) << three.status();
  static_assert(std::is_same<decltype(three), StatusOr<std::vector<Tensor>>>::value);
  EXPECT_EQ(three->size(), 3u);
  ASSERT_TRUE((*ddp)->Backward(torch::stack(*three).sum()).ok());

  DistributedDataParallel& base = **ddp;
  auto refused = base.Forward(torch::randn({2, kIn}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  auto with = base.ForwardWith([&] { return model->forward(torch::randn({2, kIn}), 2); });
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(base.Backward(torch::stack(*with).sum()).ok());
}

TEST(DdpAnyModuleTest, SequentialWithExplicitReturnTypeAndWrongTypeIsAnError) {
  auto comm = std::make_shared<FakeCommunicator>();
  auto seq = torch::nn::Sequential(torch::nn::Linear(kIn, kOut));
  auto ddp = DistributedDataParallel::Create(seq, comm);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  auto out = (*ddp)->Forward<Tensor>(torch::randn({2, kIn}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*ddp)->Backward(out->sum()).ok());
  auto wrong = (*ddp)->Forward<std::vector<Tensor>>(torch::randn({2, kIn}));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(wrong.status().message().find("return value"), std::string::npos) << wrong.status();
}

TEST(DdpAnyModuleTest, EmptyHolderIsInvalidArgument) {
  auto comm = std::make_shared<FakeCommunicator>();
  auto ddp = DistributedDataParallel::Create(torch::nn::Sequential(nullptr), comm);
  EXPECT_EQ(ddp.status().code(), absl::StatusCode::kInvalidArgument) << ddp.status();
}

TEST(DdpAnyModuleTest, SharedPtrAndAnyModuleAreAccepted) {
  auto comm = std::make_shared<FakeCommunicator>();
  auto impl = std::make_shared<TwoInputNetImpl>();
  auto from_ptr = DistributedDataParallel::Create(impl, comm);
  ASSERT_TRUE(from_ptr.ok()) << from_ptr.status();
  auto out = (*from_ptr)->Forward(torch::randn({2, kIn}), torch::randn({2, kIn}));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*from_ptr)->Backward(out->sum()).ok());

  auto from_any = DistributedDataParallel::Create(torch::nn::AnyModule(TupleNet()), comm);
  ASSERT_TRUE(from_any.ok()) << from_any.status();
  auto tuple = (*from_any)->Forward<std::tuple<Tensor, Tensor>>(torch::randn({2, kIn}));
  ASSERT_TRUE(tuple.ok()) << tuple.status();
  Status backward =
      (*from_any)->Backward(std::get<0>(*tuple).sum() + std::get<1>(*tuple).sum());
  EXPECT_TRUE(backward.ok()) << backward;
}

// ---- Ranks that disagree ------------------------------------------------
//
// Over Gloo, collectives of different sizes abort a process in Gloo's
// transport thread; DDP compares the ranks' models and options before its
// first collective, so every rank gets the same InvalidArgument instead.

// Creates a DDP on each of kWorld ranks (threads over Gloo), the module and
// options of rank r from make(r); returns each rank's status.
std::vector<Status> CreateOnRanks(
    const std::function<std::pair<torch::nn::Sequential, DdpOptions>(int)>& make) {
  FakeStore store;
  std::vector<Status> status(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = [&]() -> Status {
        ASSIGN_OR_RETURN(auto comm, test_ranks::ConnectGloo(&store, rank, kWorld));
        auto [module, options] = make(rank);
        options.report_progress = false;
        options.timeout = std::chrono::seconds(30);
        return DistributedDataParallel::Create(module, comm, options).status();
      }();
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

void ExpectRefusedEverywhere(const std::vector<Status>& status,
                             const std::vector<std::string>& says) {
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << "rank " << r << ": " << status[r];
    for (const auto& s : says) {
      EXPECT_NE(status[r].message().find(s), std::string::npos)
          << "rank " << r << " does not say '" << s << "': " << status[r];
    }
  }
}

TEST(DdpAgreementTest, ADifferentLayerShapeIsNamedOnEveryRank) {
  auto status = CreateOnRanks([](int rank) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, rank == 0 ? 8 : 16),
                              torch::nn::Linear(rank == 0 ? 8 : 16, kOut));
    return std::make_pair(net, DdpOptions());
  });
  ExpectRefusedEverywhere(status, {"same model", "'0.weight' (tensor 1 of 4)",
                                   "Float, 2 dims, 48 elements on rank 0",
                                   "Float, 2 dims, 96 elements on rank 1"});
}

TEST(DdpAgreementTest, ADifferentParameterCountIsNamedOnEveryRank) {
  auto status = CreateOnRanks([](int rank) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    if (rank == 1) net->push_back(torch::nn::Linear(kOut, kOut));
    return std::make_pair(net, DdpOptions());
  });
  ExpectRefusedEverywhere(status, {"rank 0 has 2 parameters and buffers, rank 1 has 4"});
}

TEST(DdpAgreementTest, DifferentBucketSizesAndHooksAreNamedOnEveryRank) {
  auto status = CreateOnRanks([](int rank) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    DdpOptions options;
    if (rank == 1) {
      options.bucket_cap_mb = 1;
      options.comm_hook = Fp16CompressHook();
    }
    return std::make_pair(net, options);
  });
  ExpectRefusedEverywhere(status, {"same DDP options", "bucket_cap_mb (ranks 1 differ from rank 0",
                                   "comm hook (ranks 1 differ from rank 0"});
  EXPECT_NE(status[1].message().find("'fp16' here"), std::string::npos) << status[1];
  EXPECT_NE(status[0].message().find("'allreduce' here"), std::string::npos) << status[0];
}

// A user's hooks under one name: two different callables are told apart
// by their types, and one callable on every rank is accepted.
CommHook Named(std::string name, CommHook::Fn run) {
  CommHook hook = AllreduceHook();
  hook.name = std::move(name);
  hook.run = std::move(run);
  return hook;
}

TEST(DdpAgreementTest, DifferentHooksOfOneNameAreNamedOnEveryRank) {
  auto status = CreateOnRanks([](int rank) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    DdpOptions options;
    const CommHook::Fn inner = AllreduceHook().run;
    if (rank == 0) {
      options.comm_hook =
          Named("mine", [inner](GradBucket& b, Communicator& c) { return inner(b, c); });
    } else {
      options.comm_hook = Named("mine", [inner](GradBucket& b, Communicator& c) {
        b.buffer.mul_(2);
        return inner(b, c);
      });
    }
    return std::make_pair(net, options);
  });
  ExpectRefusedEverywhere(status, {"same DDP options", "comm hook callable (ranks 1 differ from rank 0"});
  EXPECT_EQ(status[0].message().find("comm hook ("), std::string::npos)
      << "the names agree: " << status[0];
  EXPECT_NE(status[0].message().find("lambda"), std::string::npos) << status[0];
}

TEST(DdpAgreementTest, OneCustomHookOnEveryRankIsAccepted) {
  auto status = CreateOnRanks([](int) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    DdpOptions options;
    const CommHook::Fn inner = AllreduceHook().run;
    options.comm_hook =
        Named("mine", [inner](GradBucket& b, Communicator& c) { return inner(b, c); });
    return std::make_pair(net, options);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

// Two plain functions of one signature: one type, two functions.
std::shared_ptr<BucketWork> PlainAllreduce(GradBucket& bucket, Communicator& comm) {
  return AllreduceHook().run(bucket, comm);
}
std::shared_ptr<BucketWork> PlainDoubledAllreduce(GradBucket& bucket, Communicator& comm) {
  bucket.buffer.mul_(2);
  return AllreduceHook().run(bucket, comm);
}

TEST(DdpAgreementTest, DifferentPlainFunctionsOfOneSignatureAreNamedOnEveryRank) {
  auto status = CreateOnRanks([](int rank) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    DdpOptions options;
    options.comm_hook = Named("mine", rank == 0 ? &PlainAllreduce : &PlainDoubledAllreduce);
    return std::make_pair(net, options);
  });
  ExpectRefusedEverywhere(status, {"same DDP options", "comm hook callable (ranks 1 differ from rank 0"});
  // Not exported, so named by where it is: "function at <file>+0x<offset>".
  EXPECT_NE(status[0].message().find("function at "), std::string::npos) << status[0];
}

TEST(DdpAgreementTest, OnePlainFunctionOnEveryRankIsAccepted) {
  auto status = CreateOnRanks([](int) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    DdpOptions options;
    options.comm_hook = Named("mine", &PlainDoubledAllreduce);
    return std::make_pair(net, options);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

TEST(DdpAgreementTest, RanksThatAgreeAreAccepted) {
  auto status = CreateOnRanks([](int) {
    torch::nn::Sequential net(torch::nn::Linear(kIn, kOut));
    DdpOptions options;
    options.comm_hook = Bf16CompressHook();
    return std::make_pair(net, options);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
