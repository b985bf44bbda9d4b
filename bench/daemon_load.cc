// Daemon load: the memory a running lockstepd holds, and how fast it answers
// health checks and store calls, while clients park many store waits and
// hold many Session streams open, with and without a token. Prints one JSON
// line per phase:
//   {"bench":"daemon_load","label":"after","phase":"waits+streams","waits":10000,
//    "streams":10000,"rss_mb":...,"health_p50_ms":...,"store_p50_ms":...}
// Phases, each added to the last: idle; waits (--waits unary Waits parked
// on keys nobody sets); streams (--streams Session streams with the admin
// token, each answered once); unauthenticated (--unauth-streams Session
// streams without a token, kept open on this side; "refused" counts those
// the daemon refused); released (every call cancelled, --settle-s later).
//
// The daemon runs apart (its pid for RSS, its address and admin token):
//   lockstepd --coordinator --listen 127.0.0.1:0 --state-dir D --address-file A &
//   bazel run --config=opt //bench:daemon_load -- --address $(cat A) --token-file D/token --pid $!
// bench/daemon_load.sh does that for one lockstepd binary.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/median.h"
#include "common/flags.h"
#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace {

struct Config {
  std::string address;
  std::string token_file;
  int64_t pid = 0;
  int32_t waits = 10000;
  int32_t streams = 10000;
  int32_t unauth_streams = 10000;
  int32_t samples = 200;
  int32_t streams_per_channel = 500;
  double settle_s = 2;
  std::string label;
};

double RssMb(int64_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

class Load {
 public:
  explicit Load(const Config& config, std::string token) : config_(config), token_(std::move(token)) {
    probe_channel_ = NewChannel();
    probe_store_ = v1::StoreService::NewStub(probe_channel_);
    cq_thread_ = std::thread([this] { Drain(); });
  }
  ~Load() {
    for (auto& ctx : contexts_) ctx->TryCancel();
    cq_.Shutdown();
    cq_thread_.join();
    session_cq_.Shutdown();
    void* tag;
    bool ok;
    while (session_cq_.Next(&tag, &ok)) {
    }
  }

  // Parks `n` unary Waits on keys nobody sets (--streams-per-channel per
  // connection: a server caps the streams of one connection).
  void ParkWaits(int n) {
    for (int i = 0; i < n; ++i) {
      if (i % std::max(1, config_.streams_per_channel) == 0) {
        stubs_.push_back(v1::StoreService::NewStub(NewChannel()));
      }
      v1::StoreService::Stub* stub = stubs_.back().get();
      auto* call = NewCall();
      call->ctx->AddMetadata("authorization", "Bearer " + token_);
      v1::StoreWaitRequest request;
      request.set_namespace_("load-waits/0");
      request.add_keys(absl::StrCat("never-", i));
      request.set_timeout_ms(int64_t{3600} * 1000);
      call->wait = stub->PrepareAsyncWait(call->ctx, request, &cq_);
      call->wait->StartCall();
      call->wait->Finish(&call->wait_response, &call->status, call);
    }
  }

  // Opens `n` Session streams; with a token each is answered once (waited
  // for here), without one each is expected to be refused. Returns how many
  // the daemon refused.
  int OpenStreams(int n, bool with_token) {
    std::vector<std::unique_ptr<v1::StoreService::Stub>> stubs;
    std::vector<Call*> calls;
    for (int i = 0; i < n; ++i) {
      if (i % std::max(1, config_.streams_per_channel) == 0) {
        stubs.push_back(v1::StoreService::NewStub(NewChannel()));
      }
      auto* call = NewCall();
      if (with_token) call->ctx->AddMetadata("authorization", "Bearer " + token_);
      call->ctx->AddMetadata(rendezvous::kStoreJobMetadata, "load-streams");
      call->stream = stubs.back()->PrepareAsyncSession(call->ctx, &session_cq_);
      call->stream->StartCall(&call->start_tag);
      call->op.set_id(1);
      call->op.mutable_num_keys()->set_namespace_("load-streams/0");
      calls.push_back(call);
    }
    // Per stream: start, write one op, read its answer (a refused stream's
    // read fails), then leave it open.
    int pending = n, refused = 0;
    while (pending > 0) {
      void* tag;
      bool ok;
      if (session_cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(60)) !=
          grpc::CompletionQueue::GOT_EVENT) {
        std::fprintf(stderr, "daemon_load: %d of %d streams never answered in 60 s\n", pending, n);
        break;
      }
      auto* t = static_cast<Tag*>(tag);
      Call* call = t->call;
      if (t == &call->start_tag) {
        if (!ok) {
          ++refused, --pending;
          continue;
        }
        call->stream->Write(call->op, &call->write_tag);
        call->stream->Read(&call->result, &call->read_tag);
      } else if (t == &call->read_tag) {
        if (!ok) ++refused;
        --pending;
      }
    }
    for (auto& s : stubs) stubs_.push_back(std::move(s));
    return refused;
  }

  // Median and p99 latency (ms) of health checks and of a store Set+Get.
  void Probe(double* health_p50, double* health_p99, double* store_p50, double* store_p99) {
    grpc::GenericStub generic(probe_channel_);
    std::vector<double> health, store;
    for (int i = 0; i < config_.samples; ++i) {
      auto start = std::chrono::steady_clock::now();
      grpc::ClientContext ctx;
      // HealthCheckRequest{service: ""} serializes to no bytes: one empty slice.
      grpc::Slice empty("");
      grpc::ByteBuffer request(&empty, 1), response;
      std::promise<grpc::Status> done;
      generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                        &response, [&done](grpc::Status s) { done.set_value(s); });
      grpc::Status s = done.get_future().get();
      if (!s.ok()) std::fprintf(stderr, "daemon_load: health check: %s\n", s.error_message().c_str());
      health.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());

      start = std::chrono::steady_clock::now();
      grpc::ClientContext set_ctx, get_ctx;
      set_ctx.AddMetadata("authorization", "Bearer " + token_);
      get_ctx.AddMetadata("authorization", "Bearer " + token_);
      v1::StoreSetRequest set;
      set.set_namespace_("load-probe/0");
      set.set_key("k");
      set.set_value(std::to_string(i));
      v1::StoreSetResponse set_response;
      v1::StoreGetRequest get;
      get.set_namespace_("load-probe/0");
      get.set_key("k");
      v1::StoreGetResponse get_response;
      grpc::Status a = probe_store_->Set(&set_ctx, set, &set_response);
      grpc::Status b = probe_store_->Get(&get_ctx, get, &get_response);
      if (!a.ok() || !b.ok()) {
        std::fprintf(stderr, "daemon_load: store probe: %s %s\n", a.error_message().c_str(),
                     b.error_message().c_str());
      }
      store.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    *health_p50 = Percentile(health, 0.5);
    *health_p99 = Percentile(health, 0.99);
    *store_p50 = Percentile(store, 0.5);
    *store_p99 = Percentile(store, 0.99);
  }

  // Cancels every call and stream this load opened.
  void Release() {
    for (auto& ctx : contexts_) ctx->TryCancel();
  }

 private:
  struct Call;
  struct Tag {
    Call* call;
  };
  struct Call {
    grpc::ClientContext* ctx = nullptr;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::StoreWaitResponse>> wait;
    v1::StoreWaitResponse wait_response;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::StoreOp, v1::StoreOpResult>> stream;
    v1::StoreOp op;
    v1::StoreOpResult result;
    grpc::Status status;
    Tag start_tag{this}, write_tag{this}, read_tag{this};
  };

  std::shared_ptr<grpc::Channel> NewChannel() {
    grpc::ChannelArguments args = rendezvous::LockstepChannelArguments();
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    return grpc::CreateCustomChannel(config_.address, grpc::InsecureChannelCredentials(), args);
  }

  Call* NewCall() {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    calls_.push_back(std::make_unique<Call>());
    calls_.back()->ctx = contexts_.back().get();
    return calls_.back().get();
  }

  // Completions of parked Waits (when released).
  void Drain() {
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  const Config& config_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> probe_channel_;
  std::unique_ptr<v1::StoreService::Stub> probe_store_;
  std::vector<std::unique_ptr<v1::StoreService::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<Call>> calls_;
  grpc::CompletionQueue cq_;          // parked Waits
  grpc::CompletionQueue session_cq_;  // streams, polled by OpenStreams
  std::thread cq_thread_;
};

void Report(const Config& config, Load* load, const std::string& phase, int waits, int streams,
            int unauth, int refused) {
  double h50, h99, s50, s99;
  load->Probe(&h50, &h99, &s50, &s99);
  std::cout << absl::StrFormat(
                   "{\"bench\":\"daemon_load\",\"label\":\"%s\",\"phase\":\"%s\",\"waits\":%d,"
                   "\"streams\":%d,\"unauth_streams\":%d,\"refused\":%d,\"rss_mb\":%.1f,"
                   "\"health_p50_ms\":%.3f,\"health_p99_ms\":%.3f,\"store_p50_ms\":%.3f,"
                   "\"store_p99_ms\":%.3f}",
                   config.label, phase, waits, streams, unauth, refused, RssMb(config.pid), h50, h99,
                   s50, s99)
            << std::endl;
}

int Main(int argc, char** argv) {
  Config config;
  FlagSet flags("daemon_load", "Memory and latency of lockstepd under parked waits and open streams");
  flags.String("address", &config.address, "the daemon's host:port (a coordinator: it hosts the store)");
  flags.String("token-file", &config.token_file, "the daemon's admin token file");
  flags.Int("pid", &config.pid, "the daemon's pid (its RSS is read from /proc)");
  flags.Int32("waits", &config.waits, "unary store Waits to park");
  flags.Int32("streams", &config.streams, "Session streams to open with the token");
  flags.Int32("unauth-streams", &config.unauth_streams, "Session streams to open without a token");
  flags.Int32("samples", &config.samples, "probe calls per phase");
  flags.Int32("streams-per-channel", &config.streams_per_channel, "streams per client connection");
  flags.Double("settle-s", &config.settle_s, "seconds to wait after parking and after releasing");
  flags.String("label", &config.label, "a tag for the output lines (e.g. before, after)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return FlagSet::ReportParseError(rest.status());
  if (config.address.empty() || config.token_file.empty() || config.pid <= 0) {
    std::fprintf(stderr, "daemon_load: --address, --token-file and --pid are required\n");
    return 2;
  }
  std::string token;
  std::ifstream(config.token_file) >> token;
  if (token.empty()) {
    std::fprintf(stderr, "daemon_load: no token in %s\n", config.token_file.c_str());
    return 2;
  }
  const auto settle = std::chrono::duration<double>(config.settle_s);
  auto load = std::make_unique<Load>(config, token);
  Report(config, load.get(), "idle", 0, 0, 0, 0);
  load->ParkWaits(config.waits);
  std::this_thread::sleep_for(settle);
  Report(config, load.get(), "waits", config.waits, 0, 0, 0);
  const int refused_with_token = load->OpenStreams(config.streams, true);
  if (refused_with_token > 0) {
    std::fprintf(stderr, "daemon_load: %d streams with the token were refused\n", refused_with_token);
  }
  Report(config, load.get(), "streams", config.waits, config.streams, 0, 0);
  const int refused = load->OpenStreams(config.unauth_streams, false);
  std::this_thread::sleep_for(settle);
  Report(config, load.get(), "unauthenticated", config.waits, config.streams,
         config.unauth_streams, refused);
  load->Release();
  std::this_thread::sleep_for(settle);
  Report(config, load.get(), "released", 0, 0, 0, 0);
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::Main(argc, argv); }
