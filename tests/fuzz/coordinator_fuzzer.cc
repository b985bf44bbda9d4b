// coordinator_fuzzer: the requests agents and the CLI send the coordinator,
// against its core (daemon/coordinator.h) on a fake clock and a fake job
// store: what CoordinatorGrpcService does per RPC, less the bearer check
// (store_fuzzer covers AuthorizeStore; daemon:roles_test the role check).
//
// Input: a CoordinatorSession (seeds/fuzz_input.proto). Each request is
// decoded with its own ParseFromString (the decoder gRPC runs), then goes
// where the shell sends it: RegisterNode, Heartbeat, SubmitJob, CancelJob /
// GetJob / WatchJob after the shell's job id check (IsSafeId) and, for
// WatchJob, WatchTimeout. ReportProgress goes to an agent, which this
// target does not build: it is only decoded.
// Time moves in 500 ms ticks, as lockstepd's ticker drives the core.
//
// Checked after every step: every error is short and printable (requests
// carry node ids, incarnations and job ids of any size and bytes); a START
// command hands an agent a spec the agent accepts and a consistent
// assignment; every job's round record and its mirrors agree, nodes appear
// once per round, restarts stay within budget, a finished job never
// changes; memory and the job store agree (persist, then apply).
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/address.h"
#include "common/clock.h"
#include "common/logging.h"
#include "daemon/coordinator.h"
#include "daemon/coordinator_service.h"
#include "daemon/fake_job_store.h"
#include "daemon/job_env.h"
#include "daemon/job_spec.h"
#include "lockstep/v1/agent.pb.h"
#include "lockstep/v1/coordinator.pb.h"
#include "rendezvous/store.h"
#include "tests/fuzz/fuzz_check.h"

namespace lockstep {
namespace daemon {
namespace {

using fuzz::CheckErrorMessage;
using google::protobuf::util::MessageDifferencer;

// Messages name a node, job or field and quote values to at most 64 bytes
// (QuoteForError); a job's failure message names ranks and nodes (ids of
// at most 128 safe bytes).
constexpr size_t kMaxErrorBytes = 1024;

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

CoordinatorOptions Options(std::vector<std::string>* dropped) {
  CoordinatorOptions options;
  options.lease = std::chrono::seconds(10);
  options.heartbeat_interval = std::chrono::seconds(1);
  options.restart_backoff = std::chrono::seconds(1);
  options.max_restart_backoff = std::chrono::seconds(4);
  options.store_address = "127.0.0.1:7000";
  options.drop_store_prefix = [dropped](const std::string& prefix) { dropped->push_back(prefix); };
  options.finished_jobs_in_memory = 2;  // so finished jobs leave memory
  return options;
}

class Session {
 public:
  Session() : coordinator_(Options(&dropped_), &clock_, &store_) {
    FUZZ_CHECK(coordinator_.Recover().ok(), "Recover on an empty store");
  }
  ~Session() {
    for (int64_t handle : watches_) coordinator_.Unwatch(handle);
  }

  void Step(const fuzz::Field& f) {
    if (f.number == 8 && !f.is_bytes) {
      Advance(f.varint);
    } else if (f.is_bytes) {
      switch (f.number) {
        case 1: Parse<v1::RegisterNodeRequest>(f, [&](auto& r) { Register(r); }); break;
        case 2: Parse<v1::HeartbeatRequest>(f, [&](auto& r) { Heartbeat(&r); }); break;
        case 3: Parse<v1::SubmitJobRequest>(f, [&](auto& r) { Submit(r); }); break;
        case 4: Parse<v1::CancelJobRequest>(f, [&](auto& r) { Cancel(&r); }); break;
        case 5: Parse<v1::GetJobRequest>(f, [&](auto& r) { Get(&r); }); break;
        case 6: Parse<v1::WatchJobRequest>(f, [&](auto& r) { Watch(&r); }); break;
        case 7: Parse<v1::ReportProgressRequest>(f, [](auto&) {}); break;  // decoded only
        case 9: Parse<v1::ListJobsRequest>(f, [&](auto& r) { List(r); }); break;
        default: break;
      }
    }
    CheckJobs();
  }

 private:
  template <typename Request, typename F>
  static void Parse(const fuzz::Field& f, F handle) {
    Request request;
    if (request.ParseFromString(f.bytes)) handle(request);
  }

  // "$N" (one digit, from 0) stands for the N-th submitted job's (random) id.
  void Resolve(std::string* job_id) const {
    if (job_id->size() == 2 && (*job_id)[0] == '$' && (*job_id)[1] >= '0' && (*job_id)[1] <= '9') {
      const size_t n = (*job_id)[1] - '0';
      if (n < submitted_.size()) *job_id = submitted_[n];
    }
  }

  // The shell's RequireJobId.
  static Status RequireJobId(const std::string& id) {
    if (id.empty()) return absl::InvalidArgumentError("job_id: empty");
    if (!IsSafeId(id)) return absl::InvalidArgumentError("job_id: not a job id");
    return absl::OkStatus();
  }

  void Register(const v1::RegisterNodeRequest& r) {
    auto got = coordinator_.RegisterNode(r);
    CheckErrorMessage(got.status(), kMaxErrorBytes, "RegisterNode");
    if (got.ok()) {
      FUZZ_CHECK(IsSafeId(r.node_id()) && IsSafeId(r.incarnation()) && IsDialableAddress(r.agent_address()),
                 "RegisterNode accepted a bad id or address");
      FUZZ_CHECK(got->lease_s() == 10 && got->heartbeat_interval_s() == 1, got->ShortDebugString());
    }
  }

  void Heartbeat(v1::HeartbeatRequest* r) {
    for (auto& report : *r->mutable_jobs()) Resolve(report.mutable_job_id());
    auto got = coordinator_.Heartbeat(*r);
    CheckErrorMessage(got.status(), kMaxErrorBytes, "Heartbeat");
    if (!got.ok()) return;
    // At most one START per job, and no STOP beside it (a report listing a
    // job twice may get two STOPs: each is "stop it").
    std::set<std::string> started, stopped;
    for (const auto& cmd : got->commands()) {
      if (cmd.kind() != v1::AgentCommand::KIND_START) {
        FUZZ_CHECK(cmd.kind() == v1::AgentCommand::KIND_STOP, cmd.ShortDebugString().substr(0, 300));
        stopped.insert(cmd.job_id());
        continue;
      }
      FUZZ_CHECK(started.insert(cmd.job_id()).second, "two STARTs for job " + cmd.job_id());
      // What Agent::StartRun checks before it spawns anything.
      FUZZ_CHECK(IsSafeId(cmd.job_id()), "START for job id " + QuoteForError(cmd.job_id()));
      Status spec = ValidateJobSpec(cmd.spec(), {});
      FUZZ_CHECK(spec.ok(), "the agent refuses the spec it is told to start: " + spec.ToString());
      Status env = CheckJobEnv(cmd.spec(), {});
      FUZZ_CHECK(env.ok(), "the agent refuses the env it is told to start: " + env.ToString());
      const v1::RoundAssignment& a = cmd.assignment();
      const std::string s = a.ShortDebugString().substr(0, 300);
      FUZZ_CHECK(a.job_id() == cmd.job_id() && a.round() == cmd.round() && a.round() >= 1, s);
      FUZZ_CHECK(a.num_nodes() == a.node_ids_size() && a.num_nodes() >= 1, s);
      FUZZ_CHECK(a.node_rank() >= 0 && a.node_rank() < a.num_nodes(), s);
      FUZZ_CHECK(a.node_ids(a.node_rank()) == r->node_id(), "an assignment for another node: " + s);
      FUZZ_CHECK(a.nproc_per_node() == cmd.spec().nproc_per_node(), s);
      FUZZ_CHECK(a.world_size() == a.num_nodes() * a.nproc_per_node(), s);
      FUZZ_CHECK(a.store_namespace() == rendezvous::StoreNamespace(a.job_id(), a.round()), s);
      FUZZ_CHECK(a.node_rank() == 0 || a.master_port() > 0, "a START before MASTER_PORT is known: " + s);
    }
    for (const auto& id : started) FUZZ_CHECK(!stopped.count(id), "START and STOP for job " + id);
  }

  void Submit(const v1::SubmitJobRequest& r) {
    auto got = coordinator_.SubmitJob(r.spec(), r.request_id());
    CheckErrorMessage(got.status(), kMaxErrorBytes, "SubmitJob");
    if (!got.ok()) return;
    FUZZ_CHECK(IsSafeId(got->job_id()), got->job_id());
    if (std::find(submitted_.begin(), submitted_.end(), got->job_id()) == submitted_.end()) {
      // PENDING, or RENDEZVOUS when enough nodes are there to open round 1;
      // FAILED when its join timeout is below a nanosecond and there are not.
      FUZZ_CHECK(got->state() == v1::JOB_STATE_PENDING || got->state() == v1::JOB_STATE_RENDEZVOUS ||
                     (got->state() == v1::JOB_STATE_FAILED && r.spec().join_timeout_s() > 0 &&
                      FromSeconds(r.spec().join_timeout_s()) <= Duration::zero()),
                 "a new job in " + v1::JobState_Name(got->state()));
      v1::JobSpec full = r.spec();
      ApplyJobSpecDefaults(&full);
      FUZZ_CHECK(MessageDifferencer::Equals(got->spec(), full), "the job's spec is not the one submitted");
      submitted_.push_back(got->job_id());
    } else {
      FUZZ_CHECK(!r.request_id().empty() && got->request_id() == r.request_id(),
                 "a job returned twice without its request id");
    }
  }

  void Cancel(v1::CancelJobRequest* r) {
    Resolve(r->mutable_job_id());
    if (!RequireJobId(r->job_id()).ok()) return;
    auto got = coordinator_.CancelJob(JobId(r->job_id()));
    CheckErrorMessage(got.status(), kMaxErrorBytes, "CancelJob");
    if (got.ok()) FUZZ_CHECK(got->state() == v1::JOB_STATE_CANCELLED, got->ShortDebugString().substr(0, 300));
  }

  void Get(v1::GetJobRequest* r) {
    Resolve(r->mutable_job_id());
    if (!RequireJobId(r->job_id()).ok()) return;
    auto got = coordinator_.GetJob(JobId(r->job_id()));
    CheckErrorMessage(got.status(), kMaxErrorBytes, "GetJob");
    FUZZ_CHECK(got.ok() || absl::IsNotFound(got.status()), got.status().ToString());
  }

  void Watch(v1::WatchJobRequest* r) {
    Resolve(r->mutable_job_id());
    if (!RequireJobId(r->job_id()).ok()) return;
    auto timeout = WatchTimeout(r->timeout_ms());
    CheckErrorMessage(timeout.status(), kMaxErrorBytes, "WatchTimeout");
    FUZZ_CHECK(timeout.ok() == (r->timeout_ms() >= 0), timeout.status().ToString());
    if (!timeout.ok()) return;
    FUZZ_CHECK(*timeout > std::chrono::milliseconds(0) && *timeout <= kMaxWatchTimeout,
               std::to_string(timeout->count()));
    auto fired = std::make_shared<int>(0);
    auto handle = coordinator_.WatchOnce(JobId(r->job_id()), r->after_version(),
                                         [fired](const v1::Job&, int64_t) { ++*fired; });
    CheckErrorMessage(handle.status(), kMaxErrorBytes, "WatchOnce");
    if (!handle.ok()) return;
    watch_fired_.push_back(fired);
    if (*handle > 0) watches_.push_back(*handle);
  }

  void List(const v1::ListJobsRequest& r) {
    std::vector<v1::JobState> states;
    for (int s : r.states()) states.push_back(static_cast<v1::JobState>(s));
    auto jobs = coordinator_.ListJobs(states);
    CheckErrorMessage(jobs.status(), kMaxErrorBytes, "ListJobs");
  }

  void Advance(uint64_t ms) {
    // lockstepd ticks every 100 ms; 500 ms steps keep inputs cheap and stay
    // under the stall threshold (2 heartbeat intervals). At most a minute.
    const int64_t total = static_cast<int64_t>(ms % 60001);
    for (int64_t done = 0; done < total; done += 500) {
      clock_.Advance(std::chrono::milliseconds(std::min<int64_t>(500, total - done)));
      coordinator_.Tick();
    }
    if (total == 0) coordinator_.Tick();
  }

  void CheckJobs() {
    for (const auto& fired : watch_fired_) FUZZ_CHECK(*fired <= 1, "a watch fired twice");
    auto jobs = coordinator_.ListJobs({});
    FUZZ_CHECK(jobs.ok(), jobs.status().ToString());
    for (const v1::Job& job : *jobs) {
      const std::string s = job.job_id() + " " + v1::JobState_Name(job.state());
      FUZZ_CHECK(job.restart_count() <= job.spec().max_restarts(), "restarts over budget: " + s);
      // A finished job stays as it ended (a failed round's late reports
      // may still add consequences, job_machine.h).
      auto seen = terminal_.find(job.job_id());
      if (seen != terminal_.end()) {
        FUZZ_CHECK(job.state() == seen->second.state() && job.restart_count() == seen->second.restart_count() &&
                       job.round() == seen->second.round(),
                   "a finished job changed: " + s);
      } else if (IsTerminal(job.state())) {
        terminal_[job.job_id()] = job;
      }
      const v1::Round& round = job.current_round();
      FUZZ_CHECK(job.round() == round.number() && job.world_size() == round.world_size() &&
                     job.master_port() == round.master_port() &&
                     std::equal(job.node_ids().begin(), job.node_ids().end(), round.node_ids().begin(),
                                round.node_ids().end()),
                 "the job's mirror fields differ from its round: " + s);
      const std::set<std::string> nodes(round.node_ids().begin(), round.node_ids().end());
      FUZZ_CHECK(nodes.size() == static_cast<size_t>(round.node_ids_size()), "a node twice in a round: " + s);
      if (round.closed()) {
        const int max_nodes = job.spec().max_nodes();
        FUZZ_CHECK(round.node_ids_size() >= 1 && round.node_ids_size() <= max_nodes, s);
        FUZZ_CHECK(round.world_size() == round.node_ids_size() * job.spec().nproc_per_node(), s);
      }
      std::set<int> ranks;
      for (const auto& w : job.workers()) {
        FUZZ_CHECK(ranks.insert(w.rank()).second, "a rank twice: " + s);
        FUZZ_CHECK(w.rank() >= 0 && (round.world_size() == 0 || w.rank() < round.world_size()),
                   "a rank outside the round: " + s);
      }
      // Persist, then apply: memory never holds what the store does not.
      auto stored = store_.jobs.find(job.job_id());
      FUZZ_CHECK(stored != store_.jobs.end() && MessageDifferencer::Equals(stored->second, job),
                 "memory and the job store differ: " + s);
    }
  }

  FakeClock clock_;
  FakeJobStore store_;
  std::vector<std::string> dropped_;
  Coordinator coordinator_;
  std::vector<std::string> submitted_;
  std::map<std::string, v1::Job> terminal_;
  std::vector<int64_t> watches_;
  std::vector<std::shared_ptr<int>> watch_fired_;
};

}  // namespace
}  // namespace daemon
}  // namespace lockstep

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lockstep::fuzz::QuietProtobufLog();
  (void)lockstep::InitLogging("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::daemon::Session session;
  lockstep::fuzz::ForEachStep(data, size, [&](const lockstep::fuzz::Field& f) { session.Step(f); });
  return 0;
}
