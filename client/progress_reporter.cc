#include "client/progress_reporter.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <optional>
#include <thread>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/worker_env.h"
#include "lockstep/v1/agent.grpc.pb.h"
#include "rendezvous/grpc_limits.h"

namespace lockstep {
namespace client {
namespace {

class DisabledReporter : public ProgressReporter {
 public:
  bool enabled() const override { return false; }
  void Report(const Progress&) override {}
  void SetCollective(const ddp::CollectiveState&) override {}
  void Flush(std::chrono::milliseconds) override {}
};

class GrpcReporter : public ProgressReporter {
 public:
  GrpcReporter(const std::string& address, std::string token, std::string job_id, int round,
               int rank)
      : stub_(v1::AgentService::NewStub(
            rendezvous::CreateLockstepChannel(address))),
        token_(std::move(token)),
        job_id_(std::move(job_id)),
        round_(round),
        rank_(rank),
        thread_([this] { Loop(); }) {}

  ~GrpcReporter() override {
    Flush(kFinalFlushTimeout);
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  bool enabled() const override { return true; }

  void Report(const Progress& p) override {
    {
      MutexLock lock(&mu_);
      pending_ = p;
      ++reported_;
    }
    cv_.SignalAll();
  }

  void SetCollective(const ddp::CollectiveState& c) override {
    MutexLock lock(&mu_);
    collective_ = c;
    if (c.active) have_beat_ = true;
  }

  void Flush(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(&mu_);
    const int64_t target = reported_;
    while (sent_ < target && !stop_) {
      if (done_cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    Logger log("progress");
    RateLimiter limiter(std::chrono::seconds(10));
    mu_.Lock();
    while (true) {
      const auto beat_end = std::chrono::steady_clock::now() + kBeatInterval;
      while (!stop_ && !pending_.has_value()) {
        if (cv_.WaitWithDeadline(&mu_, beat_end)) break;
      }
      const bool woken = stop_ || pending_.has_value();
      if (stop_ && !pending_) {
        mu_.Unlock();
        return;
      }
      // No new report within a beat: resend the latest (a liveness beat).
      if (!woken && !have_beat_) continue;
      if (pending_) {
        latest_ = *pending_;
        have_beat_ = true;
      }
      Progress p = latest_;
      pending_.reset();
      const ddp::CollectiveState c = collective_;
      int64_t seq = reported_;
      mu_.Unlock();
      v1::ReportProgressRequest req;
      req.set_job_id(job_id_);
      req.set_round(round_);
      req.set_token(token_);
      v1::RankProgress* out = req.mutable_progress();
      out->set_rank(rank_);
      out->set_step(p.step);
      out->set_samples_per_s(p.samples_per_s);
      out->set_loss(p.loss);
      out->set_forward_ms(p.forward_ms);
      out->set_backward_ms(p.backward_ms);
      out->set_exposed_comm_ms(p.exposed_comm_ms);
      out->set_bytes_reduced(p.bytes_reduced);
      out->set_buckets(p.buckets);
      out->set_step_ms(p.step_ms);
      out->set_data_ms(p.data_ms);
      out->set_optimizer_ms(p.optimizer_ms);
      for (double w : p.bucket_wait_ms) out->add_bucket_wait_ms(w);
      out->set_wait_steps(p.wait_steps);
      if (c.active) {
        out->set_in_collective(true);
        out->set_collective_step(c.step);
        out->set_collective_bucket(c.bucket);
        out->set_collective_op(c.op);
        out->set_collective_wait_ms(std::chrono::duration<double, std::milli>(
                                        std::chrono::steady_clock::now() - c.since)
                                        .count());
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kReportDeadline);
      v1::ReportProgressResponse resp;
      grpc::Status s = stub_->ReportProgress(&ctx, req, &resp);
      if (!s.ok() && limiter.Allow()) {
        log.Warn("progress report to the agent failed: {}", s.error_message());
      }
      // A report lost on the way (a deadline, the agent unreachable or
      // overloaded) is sent again, unless a newer one replaced it, after a
      // pause that doubles up to a beat. Any other answer is final (a stale
      // round, a wrong token).
      const grpc::StatusCode code = s.error_code();
      const bool lost = code == grpc::StatusCode::UNAVAILABLE ||
                        code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                        code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                        code == grpc::StatusCode::UNKNOWN;
      mu_.Lock();
      if (!lost) {
        sent_ = std::max(sent_, seq);
        retry_pause_ = kFirstRetryPause;
        done_cv_.SignalAll();
        continue;
      }
      if (!pending_) pending_ = p;
      const auto pause_end = std::chrono::steady_clock::now() + retry_pause_;
      while (!stop_) {
        if (cv_.WaitWithDeadline(&mu_, pause_end)) break;
      }
      retry_pause_ = std::min<std::chrono::milliseconds>(2 * retry_pause_, kBeatInterval);
      if (stop_) {
        mu_.Unlock();
        return;
      }
    }
  }

  std::unique_ptr<v1::AgentService::Stub> stub_;
  const std::string token_;
  const std::string job_id_;
  const int round_;
  const int rank_;
  Mutex mu_;
  CondVar cv_;
  CondVar done_cv_;
  std::optional<Progress> pending_ ABSL_GUARDED_BY(mu_);
  Progress latest_ ABSL_GUARDED_BY(mu_);  // The last one sent.
  bool have_beat_ ABSL_GUARDED_BY(mu_) = false;  // Something to beat with.
  ddp::CollectiveState collective_ ABSL_GUARDED_BY(mu_);
  int64_t reported_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;  // Reports delivered (or refused) so far.
  std::chrono::milliseconds retry_pause_ ABSL_GUARDED_BY(mu_) = kFirstRetryPause;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::unique_ptr<ProgressReporter> ProgressReporter::FromEnv() {
  std::string agent = Env(worker_env::kAgent);
  if (agent.empty()) return std::make_unique<DisabledReporter>();
  const WorkerIdentity id = ReadWorkerIdentity([](const char* n) { return std::getenv(n); });
  return std::make_unique<GrpcReporter>(agent, Env(worker_env::kAgentToken), id.job_id, id.round,
                                        id.rank);
}

}  // namespace client
}  // namespace lockstep
