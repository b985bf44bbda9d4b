#include "daemon/coordinator.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log_capture.h"
#include "daemon/fake_job_store.h"
#include "daemon/job_spec.h"
#include "daemon/test_spec.h"

namespace lockstep {
namespace daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() { Reset(); }

  void Reset() {
    CoordinatorOptions options;
    options.lease = seconds(10);
    options.restart_backoff = seconds(1);
    options.max_restart_backoff = seconds(4);
    options.store_address = "127.0.0.1:7000";
    options.drop_store_prefix = [this](const std::string& prefix) { dropped_.push_back(prefix); };
    options.finished_jobs_in_memory = finished_in_memory_;
    options.finished_job_retention = retention_;
    coord_.reset();
    coord_ = std::make_unique<Coordinator>(options, &clock_, &store_);
    ASSERT_TRUE(coord_->Recover().ok());
  }

  // Moves time on in steps of `step`, ticking after each, as the daemon's
  // ticker does (one jump of more than 2 heartbeat intervals between ticks
  // is a stalled coordinator: see StallOfTheCoordinatorCostsNoLease).
  void AdvanceTicking(Duration by, Duration step = std::chrono::milliseconds(500)) {
    for (Duration done{0}; done < by; done += step) {
      clock_.Advance(std::min(step, by - done));
      coord_->Tick();
    }
  }

  void Register(const std::string& node, const std::string& inc = "") {
    v1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_agent_address("127.0.0.1:" + std::to_string(9000 + node.back()));
    req.set_incarnation(inc.empty() ? "inc-" + node : inc);
    ASSERT_TRUE(coord_->RegisterNode(req).ok());
  }

  // Heartbeat from `node` reporting `workers` (rank -> status) for `job`.
  StatusOr<v1::HeartbeatResponse> Beat(const std::string& node, const std::string& job = "",
                                       int round = 0,
                                       std::vector<v1::WorkerStatus> workers = {},
                                       const std::string& inc = "", int master_port = 0,
                                       int64_t sent_mono_ns = 0) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_incarnation(inc.empty() ? "inc-" + node : inc);
    req.set_sent_mono_ns(sent_mono_ns);
    if (!job.empty()) {
      v1::AgentJobReport* r = req.add_jobs();
      r->set_job_id(job);
      r->set_round(round);
      r->set_master_port(master_port);
      for (auto& w : workers) *r->add_workers() = w;
    }
    return coord_->Heartbeat(req);
  }
  // A heartbeat of an agent that acknowledges directory deletions, listing
  // the deleted jobs whose directories it removed.
  StatusOr<v1::HeartbeatResponse> BeatAcking(const std::string& node,
                                             const std::vector<std::string>& removed) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_incarnation("inc-" + node);
    req.set_acks_deleted_job_ids(true);
    for (const auto& id : removed) req.add_removed_job_ids(id);
    return coord_->Heartbeat(req);
  }

  // From t = 0: n1 beats with its rank 0 of `id` running, n2 is silent,
  // for 11 s (past n2's lease of 10 s), a tick each second.
  void N1AloneFor11Seconds(const std::string& id) {
    for (int i = 0; i < 11; ++i) {
      clock_.Advance(seconds(1));
      (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)});
      coord_->Tick();
    }
  }

  // Then n1's rank stops: n2 may still run round 1's rank 1 until its fence
  // deadline, its last heartbeat (t = 0) + lease 10 s + lease/4 + 1 s =
  // 13.5 s; round 2 opens then, not before.
  void ExpectTheNextRoundAtN2sFenceDeadline(const std::string& id) {
    (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_STOPPED)});
    clock_.Advance(seconds(2));  // t = 13
    (void)Beat("n1");
    coord_->Tick();
    EXPECT_EQ(Job(id).round(), 1) << "round 2 opened before n2's fence deadline";
    clock_.Advance(milliseconds(500));  // t = 13.5
    (void)Beat("n1");
    coord_->Tick();
    EXPECT_EQ(Job(id).round(), 2);
  }

  static v1::WorkerStatus Worker(int rank, v1::WorkerState state, int code = 0, int sig = 0) {
    v1::WorkerStatus w;
    w.set_rank(rank);
    w.set_local_rank(rank % 2);
    w.set_state(state);
    if (state == v1::WORKER_STATE_EXITED) {
      w.mutable_exit()->set_exit_code(code);
      w.mutable_exit()->set_signal(sig);
    }
    return w;
  }

  v1::Job Job(const std::string& id) { return coord_->GetJob(JobId(id)).value(); }

  // Two nodes, a 2x2 job, both nodes started: returns the job id (RUNNING).
  std::string RunningTwoByTwo(int max_restarts) {
    Register("n1");
    Register("n2");
    auto job = Submit(TestSpec(2, 2, 2, max_restarts));
    EXPECT_TRUE(job.ok());
    std::string id = job->job_id();
    int round = Job(id).round();
    EXPECT_TRUE(Beat("n1", id, round,
                     {Worker(0, v1::WORKER_STATE_STARTING), Worker(1, v1::WORKER_STATE_STARTING)})
                    .ok());
    EXPECT_TRUE(Beat("n2", id, round,
                     {Worker(2, v1::WORKER_STATE_RUNNING), Worker(3, v1::WORKER_STATE_RUNNING)})
                    .ok());
    EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
    return id;
  }

  // Submits and lets one tick apply the rendezvous result.
  StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& request_id = "") {
    auto job = coord_->SubmitJob(spec, request_id);
    coord_->Tick();
    return job;
  }

  // Submits `n` one-node jobs and cancels each; their ids (empty after a
  // failed assertion).
  std::vector<std::string> CancelledJobs(int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      auto job = Submit(TestSpec(1, 1, 1, 0), "");
      EXPECT_TRUE(job.ok()) << job.status();
      if (!job.ok() || !coord_->CancelJob(JobId(job->job_id())).ok()) {
        ADD_FAILURE() << "cannot submit and cancel job " << i;
        return {};
      }
      ids.push_back(job->job_id());
    }
    return ids;
  }

  FakeClock clock_;
  FakeJobStore store_;
  std::vector<std::string> dropped_;  // store prefixes the coordinator dropped
  std::unique_ptr<Coordinator> coord_;
  int finished_in_memory_ = kDefaultFinishedJobsInMemory;
  Duration retention_ = Duration::zero();
};

TEST(JobSpecTest, RejectsBadSpecsNamingTheField) {
  v1::JobSpec ok = TestSpec(1, 1, 1, 0);
  EXPECT_TRUE(ValidateJobSpec(ok, {}).ok());

  v1::JobSpec s = ok;
  s.clear_command();
  EXPECT_EQ(ValidateJobSpec(s, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateJobSpec(s, {}).message().find("spec.command"), std::string::npos);

  s = ok;
  s.set_nproc_per_node(0);
  EXPECT_NE(ValidateJobSpec(s, {}).message().find("spec.nproc_per_node"), std::string::npos);

  s = TestSpec(3, 2, 1, 0);
  Status st = ValidateJobSpec(s, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("min 3 > max 2"), std::string::npos) << st;

  s = ok;
  s.set_max_restarts(-1);
  EXPECT_NE(ValidateJobSpec(s, {}).message().find("spec.max_restarts"), std::string::npos);

  s = ok;
  (*s.mutable_env())["A=B"] = "x";
  EXPECT_NE(ValidateJobSpec(s, {}).message().find("spec.env"), std::string::npos);

  // Root by name, or by any spelling of uid 0 the agent's lookup reads so.
  for (const char* root : {"root", "0", "00", " 0", "+0", "0000000000"}) {
    s = ok;
    s.set_run_as(root);
    EXPECT_EQ(ValidateJobSpec(s, {}).code(), absl::StatusCode::kPermissionDenied) << root;
  }
  s = ok;
  s.set_run_as("1000");
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok());

  EXPECT_EQ(ValidateJobSpec(ok, {"/bin/other"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(ValidateJobSpec(ok, {"/bin/other", "/bin/train"}).ok());
}

// Workers start in their own directory on each node: "./train" would mean
// a different file on each, unless an absolute working dir pins it.
TEST(JobSpecTest, RelativeCommandPathIsRefusedWithAHintUnlessWorkingDirIsAbsolute) {
  v1::JobSpec s = TestSpec(1, 1, 1, 0);
  s.set_command(0, "./train");
  Status st = ValidateJobSpec(s, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "spec.command: \"./train\" is a relative path, and workers start in their own "
            "directory on each node; give an absolute path (the lockstep CLI resolves a relative "
            "one against the directory you run it from)");

  s.set_command(0, "bin/train");
  s.set_working_dir("relative/dir");
  EXPECT_EQ(ValidateJobSpec(s, {}).code(), absl::StatusCode::kInvalidArgument);

  // A relative working dir is refused for any command, naming the field.
  s.set_command(0, "/bin/train");
  st = ValidateJobSpec(s, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("spec.working_dir: \"relative/dir\" is a relative path", 0), 0u)
      << st;
  s.set_command(0, "bin/train");

  s.set_working_dir("/shared/project");
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok()) << "the node resolves it against the working dir";

  s.clear_working_dir();
  s.set_command(0, "python3");
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok()) << "a bare name is a PATH lookup";
}

// Each bad field is refused naming the field, quoting at most a short
// prefix of the value, whatever its size or bytes.
TEST(JobSpecTest, ValidatesSizesCharactersNumbersAndRangesFieldByField) {
  const v1::JobSpec ok = TestSpec(1, 1, 1, 0);
  auto refused = [&](const v1::JobSpec& s, const std::string& field) {
    Status st = ValidateJobSpec(s, {});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field << ": " << st;
    EXPECT_EQ(st.message().rfind(field, 0), 0u) << "want the field first: " << st;
    EXPECT_LT(st.message().size(), 300u) << "echoes too much input: " << field;
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st;
    EXPECT_EQ(st.message().find('\0'), std::string::npos) << field;
  };

  // Sizes: the whole spec (naming its size) and each field.
  v1::JobSpec s = ok;
  (*s.mutable_env())["BIG"] = std::string(5 << 20, 'x');
  refused(s, "spec: ");
  EXPECT_NE(ValidateJobSpec(s, {}).message().find(absl::StrCat(s.ByteSizeLong(), " bytes")),
            std::string::npos);
  EXPECT_NE(ValidateJobSpec(s, {}).message().find(absl::StrCat(kMaxJobSpecBytes)),
            std::string::npos);
  s = ok;
  (*s.mutable_env())["BIG"] = std::string(kMaxArgBytes + 1, 'x');
  refused(s, "spec.env[BIG]");
  s = ok;
  s.set_name(std::string(kMaxJobNameBytes + 1, 'n'));
  refused(s, "spec.name");
  s = ok;
  s.add_command(std::string(kMaxArgBytes + 1, 'a'));
  refused(s, "spec.command[1]");
  s = ok;
  s.set_command(0, "/" + std::string(kMaxPathBytes, 'p'));
  refused(s, "spec.command[0]");
  s = ok;
  s.set_working_dir("/" + std::string(kMaxPathBytes, 'd'));
  refused(s, "spec.working_dir");
  s = ok;
  s.set_run_as(std::string(kMaxRunAsBytes + 1, 'u'));
  refused(s, "spec.run_as");
  s = ok;
  for (int i = 0; i <= kMaxArgs; ++i) s.add_command("a");
  refused(s, "spec.command");

  // Characters: NUL anywhere; control characters in single-line fields.
  s = ok;
  s.add_command(std::string("a\0b", 3));
  refused(s, "spec.command[1]");
  s = ok;
  (*s.mutable_env())["X"] = std::string("a\0b", 3);
  refused(s, "spec.env[X]");
  s = ok;
  s.set_name("two\nlines");
  refused(s, "spec.name");
  s = ok;
  s.set_working_dir("/tmp/\x1b[31m");
  refused(s, "spec.working_dir");
  s = ok;
  s.set_run_as("nobody\n");
  refused(s, "spec.run_as");
  s = ok;
  s.set_command(0, "/bin/tr\nain");
  refused(s, "spec.command[0]");
  s = ok;
  s.add_command("multi\nline args are fine");
  (*s.mutable_env())["MULTI"] = "line\nvalue";
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok());
  for (const std::string bad : {"", "1X", "A-B", "A B", "A=B", "\xc3\xa9"}) {
    s = ok;
    (*s.mutable_env())[bad] = "v";
    refused(s, "spec.env");
  }
  s = ok;
  (*s.mutable_env())["_Ok_9"] = "v";
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok());

  // Numbers: finite, >= 0, at most the maximum.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {inf, -inf, nan, -1.0, kMaxJoinTimeoutSeconds * 2}) {
    s = ok;
    s.set_join_timeout_s(bad);
    refused(s, "spec.join_timeout_s");
    s = ok;
    s.set_stop_grace_s(bad);
    refused(s, "spec.stop_grace_s");
    s = ok;
    s.set_last_call_timeout_s(bad);
    refused(s, "spec.last_call_timeout_s");
  }
  s = ok;
  s.set_join_timeout_s(kMaxJoinTimeoutSeconds);
  s.set_stop_grace_s(kMaxStopGraceSeconds);
  s.set_last_call_timeout_s(kMaxLastCallSeconds);
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok());

  // Resource limits: INT64_MAX-like values are refused naming the maximum.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  s = ok;
  s.mutable_limits()->set_max_open_files(huge);
  refused(s, "spec.limits.max_open_files");
  EXPECT_NE(ValidateJobSpec(s, {}).message().find(absl::StrCat(kMaxOpenFilesLimit)),
            std::string::npos);
  s = ok;
  s.mutable_limits()->set_max_address_space(huge);
  refused(s, "spec.limits.max_address_space");
  s = ok;
  s.mutable_limits()->set_max_cpu_seconds(huge);
  refused(s, "spec.limits.max_cpu_seconds");
  s = ok;
  s.mutable_limits()->set_max_cpu_seconds(-1);
  refused(s, "spec.limits.max_cpu_seconds");
  s = ok;
  s.mutable_limits()->set_max_processes(huge);
  refused(s, "spec.limits.max_processes");
  s = ok;
  s.mutable_limits()->set_max_processes(-1);
  refused(s, "spec.limits.max_processes");
  s = ok;
  s.mutable_limits()->set_max_open_files(kMaxOpenFilesLimit);
  s.mutable_limits()->set_max_address_space(kMaxAddressSpaceLimit);
  s.mutable_limits()->set_max_cpu_seconds(kMaxCpuSecondsLimit);
  s.mutable_limits()->set_max_processes(kMaxProcessesLimit);
  EXPECT_TRUE(ValidateJobSpec(s, {}).ok());
}

// Agents validate the spec the coordinator hands them, which has its
// defaults filled in (about 20 bytes more): a spec at the cap without them
// is refused on submit instead of by every agent. Found by
// //tests/fuzz:job_spec_fuzzer.
TEST(JobSpecTest, SizeCapCountsTheDefaultsAgentsValidate) {
  v1::JobSpec s;
  s.add_command("/bin/train");
  s.set_min_nodes(1);
  s.set_nproc_per_node(1);
  // Fillers of 16 KiB..128 KiB (3-byte length prefix) to exactly the cap.
  while (s.ByteSizeLong() + (kMaxArgBytes + 4) + (16 * 1024 + 4) <= kMaxJobSpecBytes) {
    s.add_command(std::string(kMaxArgBytes, 'x'));
  }
  s.add_command(std::string(kMaxJobSpecBytes - s.ByteSizeLong() - 4, 'x'));
  ASSERT_EQ(s.ByteSizeLong(), kMaxJobSpecBytes);
  Status st = ValidateJobSpec(s, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(st.message().rfind("spec: 262144 bytes serialized, 262155 with its defaults", 0), 0u)
      << st;

  // Trimmed so that with its defaults it is exactly at the cap, it is
  // accepted, and so is the spec agents then get.
  v1::JobSpec full = s;
  ApplyJobSpecDefaults(&full);
  std::string* last = full.mutable_command(full.command_size() - 1);
  last->resize(last->size() - (full.ByteSizeLong() - kMaxJobSpecBytes));
  ASSERT_EQ(full.ByteSizeLong(), kMaxJobSpecBytes);
  v1::JobSpec submitted = full;
  submitted.clear_max_nodes();
  submitted.clear_stop_grace_s();
  EXPECT_TRUE(ValidateJobSpec(submitted, {}).ok()) << ValidateJobSpec(submitted, {});
  v1::JobSpec handed = submitted;
  ApplyJobSpecDefaults(&handed);
  EXPECT_EQ(handed.ByteSizeLong(), kMaxJobSpecBytes);
  EXPECT_TRUE(ValidateJobSpec(handed, {}).ok()) << ValidateJobSpec(handed, {});
}

// A megabyte command that is not allowed comes back as a short prefix.
TEST(JobSpecTest, ErrorsQuoteAShortEscapedPrefix) {
  v1::JobSpec s = TestSpec(1, 1, 1, 0);
  s.set_command(0, "/" + std::string(4000, 'c'));
  Status st = ValidateJobSpec(s, {"/bin/train"});
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_LT(st.message().size(), 200u) << st;
  EXPECT_NE(st.message().find("...(4001 bytes)"), std::string::npos) << st;
}

TEST(JobSpecTest, SafeIdsRejectPathTricks) {
  EXPECT_TRUE(IsSafeId("j-0123abcd"));
  EXPECT_FALSE(IsSafeId(".."));
  EXPECT_FALSE(IsSafeId("../etc"));
  EXPECT_FALSE(IsSafeId("a/b"));
  EXPECT_FALSE(IsSafeId(""));
}

TEST_F(CoordinatorTest, SubmitRejectsInvalidSpecAndChangesNothing) {
  auto r = coord_->SubmitJob(TestSpec(3, 2, 1, 0), "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(coord_->ListJobs({})->empty());
  EXPECT_TRUE(store_.jobs.empty());
}

TEST_F(CoordinatorTest, SubmitPersistsBeforeAcknowledging) {
  auto job = coord_->SubmitJob(TestSpec(1, 1, 2, 0), "");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_PENDING);
  ASSERT_EQ(store_.jobs.count(job->job_id()), 1u);
  EXPECT_EQ(store_.jobs[job->job_id()].state(), v1::JOB_STATE_PENDING);
}

TEST_F(CoordinatorTest, SubmitFailsWhenPersistenceFails) {
  store_.fail_writes = true;
  auto job = coord_->SubmitJob(TestSpec(1, 1, 2, 0), "");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(coord_->ListJobs({})->empty());
}

TEST_F(CoordinatorTest, SubmitWithSameRequestIdReturnsSameJob) {
  auto a = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "req-1");
  auto b = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "req-1");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->job_id(), b->job_id());
  EXPECT_EQ(coord_->ListJobs({})->size(), 1u);
}

// A request id names one submission: the same id with another spec is
// refused, naming the job it made and the fields that differ, and makes
// nothing.
TEST_F(CoordinatorTest, ARequestIdReusedWithAnotherSpecIsRefused) {
  auto a = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "nightly");
  ASSERT_TRUE(a.ok()) << a.status();
  v1::JobSpec other = TestSpec(1, 1, 1, 0);
  other.add_command("--lr=0.2");
  other.set_max_restarts(2);
  auto b = coord_->SubmitJob(other, "nightly");
  ASSERT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists) << b.status();
  EXPECT_EQ(b.status().message(),
            absl::StrCat("request_id \"nightly\" was already used by job ", a->job_id(),
                         " with a different spec (spec.command, spec.max_restarts differ): a "
                         "request id resubmits only the same spec; use a new request id"));
  EXPECT_EQ(coord_->ListJobs({})->size(), 1u);
}

TEST_F(CoordinatorTest, ARequestIdIsBoundedAndPrintable) {
  for (const std::string& bad : {std::string(129, 'r'), std::string("a\nb"), std::string("a b")}) {
    auto job = coord_->SubmitJob(TestSpec(1, 1, 1, 0), bad);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    EXPECT_TRUE(absl::StartsWith(job.status().message(), "request_id ")) << job.status();
    EXPECT_EQ(job.status().message().find('\n'), std::string::npos) << job.status();
  }
  EXPECT_TRUE(coord_->SubmitJob(TestSpec(1, 1, 1, 0), std::string(128, 'r')).ok());
  EXPECT_EQ(coord_->ListJobs({})->size(), 1u);
}

static bool Lists(const v1::HeartbeatResponse& resp, const std::string& id) {
  const auto& ids = resp.deleted_job_ids();
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// A deleted job is gone from memory, the store and the list, and every
// node is told (on its next heartbeat) to remove its directory: once, for an
// agent that does not acknowledge deletions.
TEST_F(CoordinatorTest, DeleteRemovesAFinishedJobAndTellsEveryNodeOnce) {
  finished_in_memory_ = 1;  // the older job is read back from the store
  Reset();
  Register("n1");
  Register("n2");
  auto old_job = Submit(TestSpec(1, 1, 1, 0), "req-old");
  auto job = Submit(TestSpec(1, 1, 1, 0), "req-new");
  ASSERT_TRUE(old_job.ok() && job.ok());
  ASSERT_TRUE(coord_->CancelJob(JobId(old_job->job_id())).ok());
  ASSERT_TRUE(coord_->CancelJob(JobId(job->job_id())).ok());
  coord_->Tick();
  for (const std::string& id : {old_job->job_id(), job->job_id()}) {
    auto deleted = coord_->DeleteJob(JobId(id));
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_EQ(deleted->state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(coord_->GetJob(JobId(id)).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(store_.jobs.count(id), 0u);
    EXPECT_EQ(coord_->DeleteJob(JobId(id)).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(coord_->ListJobs({})->empty());
  for (const std::string node : {"n1", "n2"}) {
    auto first = Beat(node);
    ASSERT_TRUE(first.ok());
    EXPECT_TRUE(Lists(*first, old_job->job_id()) && Lists(*first, job->job_id())) << node;
    auto second = Beat(node);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(second->deleted_job_ids_size(), 0) << node;
  }
  // A retried submit of a deleted job's request makes a new job.
  auto again = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "req-old");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->job_id(), old_job->job_id());
}

// A node that has not heartbeaten since a job was deleted still hears of it
// after a coordinator restart: the deletion is kept in the job store until
// that node's next heartbeat delivers it, then forgotten there too.
TEST_F(CoordinatorTest, DirectoryDeletionsOutliveACoordinatorRestart) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(1, 1, 1, 0), "");
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(coord_->CancelJob(JobId(job->job_id())).ok());
  coord_->Tick();
  ASSERT_TRUE(coord_->DeleteJob(JobId(job->job_id())).ok());
  auto n1 = Beat("n1");
  ASSERT_TRUE(n1.ok());
  EXPECT_TRUE(Lists(*n1, job->job_id()));
  Reset();  // the coordinator restarts before n2's next heartbeat
  auto n2 = Beat("n2");
  ASSERT_TRUE(n2.ok()) << n2.status();
  EXPECT_TRUE(Lists(*n2, job->job_id())) << "the restart lost n2's deletion";
  auto n1_again = Beat("n1");
  ASSERT_TRUE(n1_again.ok());
  EXPECT_EQ(n1_again->deleted_job_ids_size(), 0) << "n1 was told before the restart";
  Reset();
  auto n2_again = Beat("n2");
  ASSERT_TRUE(n2_again.ok());
  EXPECT_EQ(n2_again->deleted_job_ids_size(), 0) << "n2 was told once already";
  EXPECT_TRUE(store_.dir_deletions.empty());
}

// To an agent that acknowledges them, a deletion is repeated in every
// response until acknowledged: a lost response (or a job still running
// there) loses nothing, a coordinator restart in between neither; once
// acknowledged it is sent no more and forgotten by the job store.
TEST_F(CoordinatorTest, DirectoryDeletionsAreRepeatedUntilTheNodeAcknowledgesThem) {
  Register("n1");
  Register("n2");
  const std::vector<std::string> ids = CancelledJobs(2);
  ASSERT_EQ(ids.size(), 2u);
  coord_->Tick();
  for (const auto& id : ids) ASSERT_TRUE(coord_->DeleteJob(JobId(id)).ok());
  // n1's first response is lost on the way: nothing acknowledged.
  auto first = BeatAcking("n1", {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(Lists(*first, ids[0]) && Lists(*first, ids[1]));
  auto again = BeatAcking("n1", {});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(Lists(*again, ids[0]) && Lists(*again, ids[1])) << "a lost response lost them";
  // n1 removed one (the other still runs there), then the coordinator restarts.
  auto partly = BeatAcking("n1", {ids[0]});
  ASSERT_TRUE(partly.ok());
  EXPECT_FALSE(Lists(*partly, ids[0])) << "sent again after its acknowledgment";
  EXPECT_TRUE(Lists(*partly, ids[1]));
  const std::map<std::string, std::set<std::string>> left = {{"n1", {ids[1]}},
                                                            {"n2", {ids[0], ids[1]}}};
  EXPECT_EQ(store_.dir_deletions, left);
  Reset();
  auto after_restart = BeatAcking("n1", {});
  ASSERT_TRUE(after_restart.ok()) << after_restart.status();
  EXPECT_FALSE(Lists(*after_restart, ids[0]));
  EXPECT_TRUE(Lists(*after_restart, ids[1])) << "the restart lost an unacknowledged deletion";
  // Acknowledged (twice: that response lost too), and an id it never had.
  for (int i = 0; i < 2; ++i) {
    auto done = BeatAcking("n1", {ids[1], "j-unknown"});
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->deleted_job_ids_size(), 0);
  }
  // n2 acknowledges both at its first heartbeat after hearing of them.
  auto n2 = BeatAcking("n2", {});
  ASSERT_TRUE(n2.ok());
  EXPECT_EQ(n2->deleted_job_ids_size(), 2);
  auto n2_done = BeatAcking("n2", ids);
  ASSERT_TRUE(n2_done.ok());
  EXPECT_EQ(n2_done->deleted_job_ids_size(), 0);
  EXPECT_TRUE(store_.dir_deletions.empty());
  Reset();
  auto quiet = BeatAcking("n1", {});
  ASSERT_TRUE(quiet.ok());
  EXPECT_EQ(quiet->deleted_job_ids_size(), 0) << "an acknowledged deletion came back after a restart";
}

// A node holds at most kMaxPendingDeletesPerNode unacknowledged directory
// deletions: past that a deleted job's directory is not queued for it, and
// the log line counts only the nodes it was queued for. One acknowledged
// deletion makes room again.
TEST_F(CoordinatorTest, DirectoryDeletionsPerNodeAreCapped) {
  // n2 (down, or an agent that never acknowledges) already holds the cap,
  // as the job store hands them to a restarted coordinator.
  std::set<std::string>& n2_held = store_.dir_deletions["n2"];
  for (size_t i = 0; i < kMaxPendingDeletesPerNode; ++i) n2_held.insert(absl::StrCat("j-old-", i));
  Reset();
  Register("n1");
  Register("n2");
  const std::vector<std::string> ids = CancelledJobs(2);
  ASSERT_EQ(ids.size(), 2u);
  coord_->Tick();
  LogCapture log;
  ASSERT_TRUE(coord_->DeleteJob(JobId(ids[0])).ok());
  EXPECT_EQ(store_.dir_deletions["n1"], std::set<std::string>{ids[0]});
  EXPECT_EQ(store_.dir_deletions["n2"].size(), kMaxPendingDeletesPerNode);
  EXPECT_EQ(store_.dir_deletions["n2"].count(ids[0]), 0u) << "queued past the cap";
  EXPECT_NE(log.Lines().find(absl::StrCat("[coordinator] job=", ids[0],
                                          " rank=- job deleted on request (it had CANCELLED); "
                                          "its directory goes from 1 node(s)\n")),
            std::string::npos)
      << log.Lines();
  auto n2 = BeatAcking("n2", {"j-old-0"});
  ASSERT_TRUE(n2.ok()) << n2.status();
  EXPECT_EQ(n2->deleted_job_ids_size(), static_cast<int>(kMaxPendingDeletesPerNode) - 1);
  EXPECT_FALSE(Lists(*n2, ids[0]));
  // Below the cap again: the next deletion is queued for both nodes.
  ASSERT_TRUE(coord_->DeleteJob(JobId(ids[1])).ok());
  EXPECT_EQ(store_.dir_deletions["n2"].count(ids[1]), 1u);
  EXPECT_NE(log.Lines().find(absl::StrCat("[coordinator] job=", ids[1],
                                          " rank=- job deleted on request (it had CANCELLED); "
                                          "its directory goes from 2 node(s)\n")),
            std::string::npos)
      << log.Lines();
}

// Metrics read the job table from memory: the jobs in memory and, by
// state, the finished ones that left it, without a store read.
TEST_F(CoordinatorTest, SummaryCountsJobsThatLeftMemoryWithoutReadingTheStore) {
  finished_in_memory_ = 1;
  Reset();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(coord_->SubmitJob(TestSpec(3, 3, 1, 0), "").value().job_id());
  auto live = coord_->SubmitJob(TestSpec(3, 3, 1, 0), "");
  ASSERT_TRUE(live.ok());
  for (const auto& id : ids) ASSERT_TRUE(coord_->CancelJob(JobId(id)).ok());
  coord_->Tick();
  Coordinator::JobsSummary summary = coord_->SummarizeJobs();
  EXPECT_EQ(summary.in_memory.size(), 2u) << "the live job and the newest finished one";
  EXPECT_EQ(summary.left_memory_by_state[v1::JOB_STATE_CANCELLED], 2);
  EXPECT_EQ(store_.job_loads, 0);
  ASSERT_TRUE(coord_->DeleteJob(JobId(ids[0])).ok());
  EXPECT_EQ(coord_->SummarizeJobs().left_memory_by_state[v1::JOB_STATE_CANCELLED], 1);
}

TEST_F(CoordinatorTest, DeleteRefusesALiveJobAndKeepsTheJobWhenTheStoreFails) {
  std::string id = RunningTwoByTwo(0);
  auto live = coord_->DeleteJob(JobId(id));
  EXPECT_EQ(live.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(live.status().message().find("is RUNNING: only a finished job can be deleted (cancel it first)"),
            std::string::npos)
      << live.status();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(coord_->CancelJob(JobId(id)).ok());
  store_.fail_writes = true;
  EXPECT_EQ(coord_->DeleteJob(JobId(id)).status().code(), absl::StatusCode::kUnavailable);
  store_.fail_writes = false;
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(store_.jobs.count(id), 1u);
  auto beat = Beat("n1");
  ASSERT_TRUE(beat.ok());
  EXPECT_FALSE(Lists(*beat, id)) << "a failed delete tells no node";
}

// Retention deletes each finished job once it ended longer ago than the
// setting, also after a restart (the store's finish times count).
TEST_F(CoordinatorTest, RetentionDeletesJobsThatEndedLongerAgo) {
  retention_ = seconds(60);
  Reset();
  Register("n1");
  // All wait for 3 nodes: they end only when cancelled.
  auto a = Submit(TestSpec(3, 3, 1, 0));
  auto b = Submit(TestSpec(3, 3, 1, 0));
  auto live = Submit(TestSpec(3, 3, 1, 0));
  ASSERT_TRUE(a.ok() && b.ok() && live.ok());
  ASSERT_TRUE(coord_->CancelJob(JobId(a->job_id())).ok());
  AdvanceTicking(seconds(30));
  ASSERT_TRUE(coord_->CancelJob(JobId(b->job_id())).ok());
  ASSERT_TRUE(Beat("n1").ok());  // keeps n1 alive; nothing deleted yet
  AdvanceTicking(seconds(29));
  EXPECT_TRUE(coord_->GetJob(JobId(a->job_id())).ok()) << "59 s after it ended";
  AdvanceTicking(seconds(2));
  EXPECT_EQ(coord_->GetJob(JobId(a->job_id())).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(coord_->GetJob(JobId(b->job_id())).ok());
  auto beat = Beat("n1");
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(Lists(*beat, a->job_id()));

  Reset();  // a restarted coordinator keeps counting from the recorded end
  AdvanceTicking(seconds(30));
  EXPECT_EQ(coord_->GetJob(JobId(b->job_id())).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.jobs.count(b->job_id()), 0u);
  EXPECT_FALSE(JobMachine::IsTerminal(Job(live->job_id()).state())) << "live jobs are never deleted";
}

// Finished jobs beyond the in-memory limit leave memory (the coordinator
// does not grow with the jobs it ran) and stay readable from the store:
// status, list in submit order, an idempotent resubmit, a watch.
TEST_F(CoordinatorTest, FinishedJobsLeaveMemoryAndAreReadFromTheStore) {
  finished_in_memory_ = 2;
  Reset();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto job = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "req-" + std::to_string(i));
    ASSERT_TRUE(job.ok());
    ids.push_back(job->job_id());
    clock_.Advance(std::chrono::milliseconds(10));
  }
  auto live = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "req-live");
  ASSERT_TRUE(live.ok());
  for (const auto& id : ids) ASSERT_TRUE(coord_->CancelJob(JobId(id)).ok());
  coord_->Tick();
  EXPECT_EQ(store_.job_loads, 0);

  // The three oldest finished jobs are read back from the store.
  auto first = coord_->GetJob(JobId(ids[0]));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(store_.job_loads, 1);
  ASSERT_TRUE(coord_->GetJob(JobId(ids[4])).ok());
  EXPECT_EQ(store_.job_loads, 1) << "the two newest finished jobs are still in memory";
  EXPECT_EQ(coord_->GetJob(JobId("j-nosuch")).status().code(), absl::StatusCode::kNotFound);

  auto all = coord_->ListJobs({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*all)[i].job_id(), ids[i]);
  EXPECT_EQ((*all)[5].job_id(), live->job_id());
  auto pending = coord_->ListJobs({v1::JOB_STATE_PENDING});
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 1u);

  auto again = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "req-1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->job_id(), ids[1]) << "a retried submit finds the job that left memory";
  EXPECT_EQ(coord_->SubmitJob(TestSpec(1, 1, 2, 0), "req-1").status().code(),
            absl::StatusCode::kAlreadyExists)
      << "the request id of a job that left memory still names that spec only";

  // Cancelling a job that left memory: it finished, as for one still there.
  auto cancel = coord_->CancelJob(JobId(ids[0]));
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kFailedPrecondition) << cancel.status();
  EXPECT_EQ(cancel.status().message(), "job " + ids[0] + " already finished as CANCELLED");
  EXPECT_EQ(coord_->CancelJob(JobId("j-nosuch")).status().code(), absl::StatusCode::kNotFound);

  auto version = coord_->GetJobVersion(JobId(ids[0]));
  ASSERT_TRUE(version.ok());
  std::string seen;
  auto handle = coord_->WatchOnce(JobId(ids[0]), version->second - 1,
                                  [&](const v1::Job& job, int64_t) { seen = job.job_id(); });
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(seen, ids[0]);

  // After a restart the same limit holds.
  Reset();
  store_.job_loads = 0;
  ASSERT_TRUE(coord_->GetJob(JobId(ids[0])).ok());
  EXPECT_EQ(store_.job_loads, 1);
}

TEST_F(CoordinatorTest, JobRunsThroughRendezvousToSucceeded) {
  Register("n2");
  Register("n1");
  auto job = Submit(TestSpec(2, 2, 2, 0));
  ASSERT_TRUE(job.ok());
  v1::Job j = Job(job->job_id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(j.round(), 1);
  ASSERT_EQ(j.node_ids_size(), 2);
  EXPECT_EQ(j.node_ids(0), "n1");  // node ranks follow sorted node ids
  EXPECT_EQ(j.world_size(), 4);

  // Node rank 0 starts first, with no MASTER_PORT: its agent picks one.
  auto resp = Beat("n2");
  ASSERT_TRUE(resp.ok());
  EXPECT_EQ(resp->commands_size(), 0) << "node rank 1 must wait for MASTER_PORT";
  resp = Beat("n1");
  ASSERT_TRUE(resp.ok());
  ASSERT_EQ(resp->commands_size(), 1);
  EXPECT_EQ(resp->commands(0).assignment().node_rank(), 0);
  EXPECT_EQ(resp->commands(0).assignment().master_port(), 0);

  std::string id = job->job_id();
  ASSERT_TRUE(Beat("n1", id, 1,
                   {Worker(0, v1::WORKER_STATE_STARTING), Worker(1, v1::WORKER_STATE_STARTING)}, "",
                   /*master_port=*/29777)
                  .ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Job(id).master_port(), 29777);
  EXPECT_EQ(store_.jobs[id].master_port(), 29777) << "the port is persisted";

  resp = Beat("n2");
  ASSERT_TRUE(resp.ok());
  ASSERT_EQ(resp->commands_size(), 1);
  const v1::AgentCommand& cmd = resp->commands(0);
  EXPECT_EQ(cmd.kind(), v1::AgentCommand::KIND_START);
  EXPECT_EQ(cmd.round(), 1);
  EXPECT_EQ(cmd.assignment().node_rank(), 1);
  EXPECT_EQ(cmd.assignment().world_size(), 4);
  EXPECT_EQ(cmd.assignment().master_addr(), "127.0.0.1");
  EXPECT_EQ(cmd.assignment().master_port(), 29777);
  EXPECT_EQ(cmd.assignment().store_address(), "127.0.0.1:7000");
  EXPECT_EQ(cmd.assignment().store_namespace(), job->job_id() + "/1");

  ASSERT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_STARTING),
                                 Worker(3, v1::WORKER_STATE_STARTING)}).ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED),
                                 Worker(1, v1::WORKER_STATE_EXITED)}).ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_EXITED),
                                 Worker(3, v1::WORKER_STATE_EXITED)}).ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(store_.jobs[id].state(), v1::JOB_STATE_SUCCEEDED);
  // A finished job is no longer commanded.
  EXPECT_EQ(Beat("n1")->commands_size(), 0);
}

TEST_F(CoordinatorTest, PendingUntilMinNodesThenLastCallForMore) {
  auto job = coord_->SubmitJob(TestSpec(1, 2, 1, 0), "");
  ASSERT_TRUE(job.ok());
  coord_->Tick();
  EXPECT_EQ(Job(job->job_id()).state(), v1::JOB_STATE_PENDING);
  Register("n1");
  coord_->Tick();
  EXPECT_EQ(Job(job->job_id()).state(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Job(job->job_id()).node_ids_size(), 0) << "last call still open";
  clock_.Advance(milliseconds(1100));
  coord_->Tick();
  EXPECT_EQ(Job(job->job_id()).node_ids_size(), 1);
}

TEST_F(CoordinatorTest, WorkerFailureRestartsWithBackoffAndNewRound) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/2);
  ASSERT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_EXITED, 0, 9),
                                 Worker(3, v1::WORKER_STATE_RUNNING)}).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restart_count(), 1);
  EXPECT_EQ(j.first_failure().rank(), 2);
  EXPECT_EQ(j.first_failure().exit().signal(), 9);
  EXPECT_EQ(store_.jobs[id].restart_count(), 1) << "restart count persisted";

  // Not commanded any more: the agents must stop it.
  auto resp = Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING),
                                 Worker(1, v1::WORKER_STATE_RUNNING)});
  ASSERT_EQ(resp->commands_size(), 1);
  EXPECT_EQ(resp->commands(0).kind(), v1::AgentCommand::KIND_STOP);

  // Backoff passed, but n1 still reports live workers: no new round yet.
  clock_.Advance(seconds(2));
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_STOPPED),
                                 Worker(1, v1::WORKER_STATE_STOPPED)}).ok());
  ASSERT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_EXITED, 0, 9),
                                 Worker(3, v1::WORKER_STATE_STOPPED)}).ok());
  coord_->Tick();
  j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(j.round(), 2);
  EXPECT_EQ(j.node_ids_size(), 2);

  // A late report from round 1 is fenced off.
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 1)}).ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Job(id).restart_count(), 1);
  EXPECT_EQ(Beat("n1")->commands(0).assignment().restart_count(), 1);
}

TEST_F(CoordinatorTest, BudgetSpentFailsWithFirstFailure) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/0);
  v1::WorkerStatus w = Worker(1, v1::WORKER_STATE_EXITED, 3);
  w.mutable_exit()->set_startup_failure(true);
  w.mutable_exit()->add_last_log_lines("boom");
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING), w}).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.first_failure().rank(), 1);
  EXPECT_EQ(j.first_failure().exit().exit_code(), 3);
  EXPECT_EQ(j.first_failure().exit().last_log_lines(0), "boom");
  EXPECT_NE(j.message().find("rank 1"), std::string::npos) << j.message();
  EXPECT_NE(j.message().find("code 3"), std::string::npos) << j.message();
  EXPECT_NE(j.message().find("startup failure"), std::string::npos) << j.message();
}

// A missing program fails the same way on every try: the job fails at once,
// its restart budget untouched.
TEST_F(CoordinatorTest, LaunchErrorFailsTheJobAtOnceWhateverTheBudget) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(2, 2, 2, /*max_restarts=*/3));
  ASSERT_TRUE(job.ok());
  std::string id = job->job_id();
  const std::string why = "launch /x/train: exec \"/x/train\": No such file or directory";
  std::vector<v1::WorkerStatus> ws = {Worker(0, v1::WORKER_STATE_EXITED, 127),
                                      Worker(1, v1::WORKER_STATE_EXITED, 127)};
  for (auto& w : ws) {
    w.mutable_exit()->set_launch_error(true);
    w.mutable_exit()->set_message(why);
  }
  ASSERT_TRUE(Beat("n1", id, Job(id).round(), ws).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.restart_count(), 0);
  EXPECT_EQ(j.first_failure().rank(), 0);
  EXPECT_TRUE(j.first_failure().exit().launch_error());
  EXPECT_EQ(j.message(), "rank 0 on node n1 could not be launched: " + why +
                             "; not retried (a restart cannot fix a launch error)");
  EXPECT_EQ(store_.jobs[id].state(), v1::JOB_STATE_FAILED) << "persisted";
}

// The same exit code without launch_error (the node could not fork, say)
// may pass: it spends a restart like any other failure.
TEST_F(CoordinatorTest, UnstartedWorkerWithoutLaunchErrorRestarts) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/3);
  v1::WorkerStatus w = Worker(0, v1::WORKER_STATE_EXITED, 127);
  w.mutable_exit()->set_message("launch /x/train: fork: Resource temporarily unavailable");
  ASSERT_TRUE(Beat("n1", id, 1, {w, Worker(1, v1::WORKER_STATE_RUNNING)}).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restart_count(), 1);
}

// kill -9 of rank 1; its peer rank 0 fails ~100 ms later; both exits reach
// the coordinator in one heartbeat. The root cause is the earlier exit, not
// the lower rank.
TEST_F(CoordinatorTest, FirstFailureIsTheEarliestExitNotTheLowestRank) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/0);
  v1::WorkerStatus killed = Worker(1, v1::WORKER_STATE_EXITED, 0, /*sig=*/9);
  killed.mutable_exit()->set_exited_unix_ms(1'700'000'000'000);
  v1::WorkerStatus peer = Worker(0, v1::WORKER_STATE_EXITED, 1);
  peer.mutable_exit()->set_exited_unix_ms(1'700'000'000'100);
  ASSERT_TRUE(Beat("n1", id, 1, {peer, killed}).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.first_failure().rank(), 1);
  EXPECT_EQ(j.first_failure().exit().signal(), 9);
}

TEST_F(CoordinatorTest, RestartBudgetIsPerJobNotPerNode) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/1);
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 1)}).ok());
  ASSERT_EQ(Job(id).restart_count(), 1);
  // Both nodes stop; round 2 runs; a failure on the *other* node spends the
  // same budget.
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 1), Worker(1, v1::WORKER_STATE_STOPPED)});
  (void)Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_STOPPED), Worker(3, v1::WORKER_STATE_STOPPED)});
  clock_.Advance(seconds(2));
  coord_->Tick();
  ASSERT_EQ(Job(id).round(), 2);
  ASSERT_TRUE(Beat("n2", id, 2, {Worker(3, v1::WORKER_STATE_EXITED, 7)}).ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(Job(id).restart_count(), 1);
}

TEST_F(CoordinatorTest, NodeWithoutHeartbeatIsDeclaredDeadAndElasticJobGoesOnWithSurvivor) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(1, 2, 1, 3));
  std::string id = job->job_id();
  ASSERT_EQ(Job(id).node_ids_size(), 2);
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)});
  (void)Beat("n2", id, 1, {Worker(1, v1::WORKER_STATE_RUNNING)});
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);

  N1AloneFor11Seconds(id);
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(Job(id).first_failure().reason().find("node n2 lost"), std::string::npos);
  auto nodes = coord_->ListNodes();
  EXPECT_FALSE(nodes[1].alive());

  ExpectTheNextRoundAtN2sFenceDeadline(id);
  clock_.Advance(seconds(1));  // last call for a second node
  (void)Beat("n1");
  coord_->Tick();
  v1::Job j = Job(id);
  EXPECT_EQ(j.round(), 2);
  ASSERT_EQ(j.node_ids_size(), 1);
  EXPECT_EQ(j.node_ids(0), "n1");
  EXPECT_EQ(j.world_size(), 1);
}

// A node lost right after the heartbeat whose answer started its workers
// (its report, sent before, listed none of the job) may run them until its
// fence deadline all the same: the next round waits for it, as for a node
// that reported them. Before, the report without the job let the next round
// open as soon as the node was declared dead, and its rank had two owners.
TEST_F(CoordinatorTest, ANodeLostJustAfterItsStartWaitsOutItsFenceDeadline) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(1, 2, 1, 3));
  std::string id = job->job_id();
  ASSERT_EQ(Job(id).node_ids_size(), 2);
  // Node rank 0 reports its MASTER_PORT: node rank 1 may start.
  auto started = Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)}, "", 29500);
  ASSERT_TRUE(started.ok()) << started.status();
  // n2's last heartbeat (t = 0) reports nothing; its answer starts rank 1.
  auto answer = Beat("n2");
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->commands_size(), 1);
  ASSERT_EQ(answer->commands(0).kind(), v1::AgentCommand::KIND_START);
  ASSERT_EQ(answer->commands(0).job_id(), id);
  N1AloneFor11Seconds(id);
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  ExpectTheNextRoundAtN2sFenceDeadline(id);
}

// A live node started since its last report is waited for until it reports
// again (its workers may be starting), then not: a report without the job
// after the start says it has none.
TEST_F(CoordinatorTest, ARestartWaitsForTheReportAfterAStart) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(1, 2, 1, 3));
  std::string id = job->job_id();
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)}, "", 29500);
  auto answer = Beat("n2");  // started by its answer
  ASSERT_TRUE(answer.ok());
  ASSERT_EQ(answer->commands_size(), 1);
  // Rank 0 fails: the job restarts; n1's workers are gone.
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 1)}).ok());
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  clock_.Advance(seconds(5));  // past the backoff; n2 silent but alive
  (void)Beat("n1");
  coord_->Tick();
  EXPECT_EQ(Job(id).round(), 1) << "round 2 opened while n2 may be starting round 1's rank 1";
  // n2 reports its rank 1 stopped: now it has none.
  (void)Beat("n2", id, 1, {Worker(1, v1::WORKER_STATE_STOPPED)});
  coord_->Tick();
  EXPECT_EQ(Job(id).round(), 2);
}

TEST_F(CoordinatorTest, NewNodeJoinsRunningElasticJobAtNextRoundWithoutSpendingBudget) {
  Register("n1");
  auto job = coord_->SubmitJob(TestSpec(1, 2, 1, 0), "");
  std::string id = job->job_id();
  clock_.Advance(seconds(2));
  coord_->Tick();
  ASSERT_EQ(Job(id).node_ids_size(), 1);
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)});
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  Register("n2");
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(Job(id).restart_count(), 0);
  EXPECT_EQ(Job(id).rescale_count(), 1);
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_STOPPED)});
  coord_->Tick();
  EXPECT_EQ(Job(id).round(), 2);
  EXPECT_EQ(Job(id).node_ids_size(), 2);
}

// A node that joins an elastic job and cannot launch it (the program is
// missing there) is left out, and the job goes on with the others: not
// FAILED, whatever its budget (0 here), and no restart counted. The node is
// eligible again once it comes back as another incarnation (its lockstepd
// restarted after a fix). Before, the joining node failed the job outright.
TEST_F(CoordinatorTest, ANodeThatCannotLaunchAnElasticJobIsLeftOutNotTheJobFailed) {
  Register("n1");
  auto job = coord_->SubmitJob(TestSpec(1, 2, 1, /*max_restarts=*/0), "");
  ASSERT_TRUE(job.ok());
  std::string id = job->job_id();
  clock_.Advance(seconds(2));
  coord_->Tick();
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)}, "", 29500);
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  Register("n2");
  coord_->Tick();
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_STOPPED)});
  coord_->Tick();
  ASSERT_EQ(Job(id).round(), 2);
  ASSERT_EQ(Job(id).node_ids_size(), 2);
  (void)Beat("n1", id, 2, {Worker(0, v1::WORKER_STATE_RUNNING)}, "", 29500);
  v1::WorkerStatus missing = Worker(1, v1::WORKER_STATE_EXITED, 127);
  missing.mutable_exit()->set_launch_error(true);
  missing.mutable_exit()->set_message("launch /x/train: exec \"/x/train\": No such file or directory");
  ASSERT_TRUE(Beat("n2", id, 2, {missing}).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.message();
  EXPECT_EQ(j.restart_count(), 0);
  EXPECT_EQ(j.first_failure().node_id(), "n2");
  EXPECT_TRUE(j.first_failure().exit().launch_error());
  EXPECT_NE(j.message().find("rank 1 on node n2 could not be launched: launch /x/train"),
            std::string::npos) << j.message();
  EXPECT_NE(j.message().find("node n2 left out of the job (restart its lockstepd once fixed)"),
            std::string::npos) << j.message();
  // Round 3: n1 alone, once its last call passed; n2 is not asked again.
  (void)Beat("n1", id, 2, {Worker(0, v1::WORKER_STATE_STOPPED)});
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(seconds(1));
    (void)Beat("n1");
    (void)Beat("n2");
    coord_->Tick();
  }
  j = Job(id);
  ASSERT_EQ(j.round(), 3);
  ASSERT_EQ(j.node_ids_size(), 1);
  EXPECT_EQ(j.node_ids(0), "n1");
  (void)Beat("n1", id, 3, {Worker(0, v1::WORKER_STATE_RUNNING)}, "", 29500);
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING) << "n2 was asked to join again";
  EXPECT_EQ(Job(id).round(), 3);
  // n2's lockstepd restarts (a new incarnation): it may join again.
  Register("n2", "inc-n2-fixed");
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(Job(id).rescale_count(), 3);  // two joins of n2, one leaving out
  EXPECT_EQ(Job(id).restart_count(), 0);
}

// Left out only where the job keeps MIN nodes without it; else it fails at
// once as a static job does.
TEST_F(CoordinatorTest, ALaunchErrorThatWouldLeaveTooFewNodesFailsTheElasticJob) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(2, 3, 1, /*max_restarts=*/3));
  ASSERT_TRUE(job.ok());
  std::string id = job->job_id();
  clock_.Advance(seconds(5));  // past the last call for a third node
  coord_->Tick();
  ASSERT_EQ(Job(id).node_ids_size(), 2);
  v1::WorkerStatus missing = Worker(0, v1::WORKER_STATE_EXITED, 127);
  missing.mutable_exit()->set_launch_error(true);
  missing.mutable_exit()->set_message("launch /x/train: exec \"/x/train\": No such file or directory");
  ASSERT_TRUE(Beat("n1", id, Job(id).round(), {missing}).ok());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(Job(id).restart_count(), 0);
}

// The join timeout counts from when the open round last had MIN nodes, as
// the README says, not from when it opened: a node lost late in a long last
// call failed the job at once.
TEST_F(CoordinatorTest, TheJoinTimeoutCountsFromWhenTheRoundFellBelowMin) {
  Register("n1");
  Register("n2");
  v1::JobSpec spec = TestSpec(2, 3, 1, 0, /*last_call_s=*/30);
  spec.set_join_timeout_s(10);
  auto job = Submit(spec);
  ASSERT_TRUE(job.ok());
  std::string id = job->job_id();
  for (int t = 1; t <= 26; ++t) {  // n2 beats until t = 15, dead at t = 25
    clock_.Advance(seconds(1));
    (void)Beat("n1");
    if (t <= 15) (void)Beat("n2");
    coord_->Tick();
  }
  ASSERT_FALSE(coord_->ListNodes()[1].alive());
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RENDEZVOUS) << Job(id).message();
  for (int t = 27; t <= 36; ++t) {
    clock_.Advance(seconds(1));
    (void)Beat("n1");
    coord_->Tick();
  }
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_FAILED) << Job(id).message();
}

TEST_F(CoordinatorTest, StaleIncarnationAndUnknownNodeAreRejected) {
  Register("n1");
  EXPECT_EQ(Beat("n1", "", 0, {}, "inc-old").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Beat("nx").status().code(), absl::StatusCode::kNotFound);
  v1::RegisterNodeRequest bad;
  bad.set_node_id("../x");
  bad.set_incarnation("i");
  EXPECT_EQ(coord_->RegisterNode(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A bad node id comes back quoted, short and escaped, whatever its size and
// bytes. Found by //tests/fuzz:coordinator_fuzzer.
TEST_F(CoordinatorTest, RegisterQuotesABadNodeIdShortAndEscaped) {
  v1::RegisterNodeRequest req;
  req.set_node_id("n1\n2026-01-01 I [coordinator] node n9 registered" + std::string(4000, 'x'));
  req.set_incarnation("i");
  auto r = coord_->RegisterNode(req);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_LT(r.status().message().size(), 200u) << r.status();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status();
  EXPECT_EQ(r.status().message().rfind("node_id \"n1\\n2026", 0), 0u) << r.status();
}

// What a node registers is stored, logged and printed by `lockstep
// nodes`: an address workers can dial, a bounded printable hostname, an
// incarnation of id characters. Anything else is refused naming the field.
TEST_F(CoordinatorTest, RegisterRefusesAddressesHostnamesAndIncarnationsItCannotUse) {
  auto refused = [&](const std::string& address, const std::string& hostname,
                     const std::string& incarnation, const std::string& field) {
    v1::RegisterNodeRequest req;
    req.set_node_id("n1");
    req.set_agent_address(address);
    req.set_hostname(hostname);
    req.set_incarnation(incarnation);
    auto r = coord_->RegisterNode(req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << QuoteForError(address) << " " << QuoteForError(hostname) << " " << r.status();
    EXPECT_TRUE(absl::StartsWith(r.status().message(), "node n1: " + field)) << r.status();
    EXPECT_EQ(r.status().message().find('\x1b'), std::string::npos) << r.status();
    EXPECT_LT(r.status().message().size(), 400u) << r.status();
  };
  refused("\x1b[31mEVIL\x1b[0m:1", "h", "inc-1", "agent_address");
  refused("", "h", "inc-1", "agent_address");
  refused("10.0.0.1", "h", "inc-1", "agent_address");
  refused("10.0.0.1:0", "h", "inc-1", "agent_address");
  refused("10.0.0.1:70000", "h", "inc-1", "agent_address");
  refused("10.0.0.1:x", "h", "inc-1", "agent_address");
  refused("a b:1", "h", "inc-1", "agent_address");
  refused(std::string(300, 'a') + ":1", "h", "inc-1", "agent_address");
  refused("10.0.0.1:9001", "h\nI [coordinator] forged", "inc-1", "hostname");
  refused("10.0.0.1:9001", std::string(300, 'h'), "inc-1", "hostname");
  refused("10.0.0.1:9001", "h", "inc\x1b", "incarnation");
  refused("10.0.0.1:9001", "h", std::string(1 << 20, 'i'), "incarnation");
  EXPECT_TRUE(coord_->ListNodes().empty()) << "a refused node is not registered";

  for (const char* good : {"10.0.0.1:9001", "[::1]:9001", "node-a.example.org:29400",
                                  "[fe80::1%eth0]:9001"}) {
    v1::RegisterNodeRequest req;
    req.set_node_id("n1");
    req.set_agent_address(good);
    req.set_hostname("node-a");
    req.set_incarnation("inc-1");
    EXPECT_TRUE(coord_->RegisterNode(req).ok()) << good;
  }
}

TEST_F(CoordinatorTest, AgentRestartWithNewIncarnationFailsItsRound) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/1);
  Register("n2", "inc-n2-second");
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(Job(id).restart_count(), 1);
  EXPECT_EQ(Beat("n2").status().code(), absl::StatusCode::kAborted) << "old incarnation fenced";
}

TEST_F(CoordinatorTest, CancelStopsWorkersAndRejectsSecondCancel) {
  std::string id = RunningTwoByTwo(0);
  auto c = coord_->CancelJob(JobId(id));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(store_.jobs[id].state(), v1::JOB_STATE_CANCELLED);
  auto resp = Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)});
  ASSERT_EQ(resp->commands_size(), 1);
  EXPECT_EQ(resp->commands(0).kind(), v1::AgentCommand::KIND_STOP);
  auto again = coord_->CancelJob(JobId(id));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  // The state as the CLI prints it, not the enum's name.
  EXPECT_EQ(again.status().message(), absl::StrCat("job ", id, " already finished as CANCELLED"));
  EXPECT_EQ(coord_->CancelJob(JobId("j-nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coord_->GetJob(JobId("j-nope")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, RecoverReloadsJobsHistoryAndNodes) {
  std::string id = RunningTwoByTwo(3);
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 2)});
  ASSERT_EQ(Job(id).restart_count(), 1);
  int history = Job(id).history_size();

  Reset();  // a new coordinator over the same store
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restart_count(), 1);
  EXPECT_EQ(j.history_size(), history);
  EXPECT_EQ(coord_->ListNodes().size(), 2u);
  // Agents keep their incarnation across a coordinator restart.
  EXPECT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_STOPPED)}).ok());
  EXPECT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_STOPPED)}).ok());
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RENDEZVOUS);
  EXPECT_EQ(Job(id).round(), 2);
}

TEST_F(CoordinatorTest, RecoveredNodeThatNeverReturnsIsDeclaredDeadAfterLease) {
  std::string id = RunningTwoByTwo(3);
  Reset();
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(seconds(1));
    (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING), Worker(1, v1::WORKER_STATE_RUNNING)});
    coord_->Tick();
  }
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING) << "a full lease from the reload";
  clock_.Advance(seconds(1));
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING), Worker(1, v1::WORKER_STATE_RUNNING)});
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(Job(id).first_failure().reason().find("n2"), std::string::npos);
}

TEST_F(CoordinatorTest, WatchFiresOnNextChange) {
  auto job = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "");
  auto v = coord_->GetJobVersion(JobId(job->job_id()));
  ASSERT_TRUE(v.ok());
  v1::JobState seen = v1::JOB_STATE_UNSPECIFIED;
  auto handle = coord_->WatchOnce(JobId(job->job_id()), v->second,
                                  [&](const v1::Job& j, int64_t) { seen = j.state(); });
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(seen, v1::JOB_STATE_UNSPECIFIED);
  ASSERT_TRUE(coord_->CancelJob(JobId(job->job_id())).ok());
  EXPECT_EQ(seen, v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(coord_->Unwatch(*handle));
}

TEST_F(CoordinatorTest, ParticipantLostBeforeItsRanksStartedRedoesTheRound) {
  Register("n1");
  Register("n2");
  auto job = Submit(TestSpec(1, 2, 1, 1));
  std::string id = job->job_id();
  ASSERT_EQ(Job(id).node_ids_size(), 2);
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RENDEZVOUS);
  Register("n2", "inc-n2-second");  // n2's agent restarted before starting rank 1
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restart_count(), 1);
  EXPECT_NE(j.first_failure().reason().find("node n2 lost: agent restarted"), std::string::npos);
  (void)Beat("n1");  // reports no workers: nothing of round 1 runs
  (void)Beat("n2", "", 0, {}, "inc-n2-second");
  clock_.Advance(seconds(1));
  coord_->Tick();
  j = Job(id);
  EXPECT_EQ(j.round(), 2);
  EXPECT_EQ(j.node_ids_size(), 2);
}

TEST_F(CoordinatorTest, JoinTimeoutFailsRoundWithoutEnoughNodes) {
  v1::JobSpec spec = TestSpec(2, 2, 1, 0);
  spec.set_join_timeout_s(5);
  Register("n1");
  auto job = coord_->SubmitJob(spec, "");
  clock_.Advance(seconds(6));
  (void)Beat("n1");
  coord_->Tick();
  EXPECT_EQ(Job(job->job_id()).state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(Job(job->job_id()).message().find("fewer than min 2"), std::string::npos);
}

TEST_F(CoordinatorTest, RoundRecordIsPersistedWithTheJob) {
  std::string id = RunningTwoByTwo(0);
  const v1::Round& r = store_.jobs[id].current_round();
  EXPECT_EQ(r.number(), 1);
  EXPECT_TRUE(r.closed());
  ASSERT_EQ(r.node_ids_size(), 2);
  EXPECT_EQ(r.node_ids(0), "n1");
  EXPECT_EQ(r.world_size(), 4);
  EXPECT_EQ(r.opened_unix_ms(), clock_.UnixMillis());
  // The fields the CLI reads mirror it.
  EXPECT_EQ(store_.jobs[id].round(), 1);
  EXPECT_EQ(store_.jobs[id].world_size(), 4);
  EXPECT_EQ(store_.jobs[id].node_ids_size(), 2);
}

// Compute, persist, apply: a write that fails leaves the job, its runtime
// state and its version as they were, and the caller gets the error. A
// heartbeat is still accepted (the lease renewed), with the error in
// reports_not_applied: the agent keeps its workers and reports again.
TEST_F(CoordinatorTest, FailedPersistenceChangesNothing) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/2);
  const v1::Job before = Job(id);
  const int64_t version = coord_->GetJobVersion(JobId(id))->second;
  store_.fail_writes = true;

  auto beat = Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_EXITED, 1),
                                 Worker(3, v1::WORKER_STATE_RUNNING)});
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_NE(beat->reports_not_applied().find("fake job store: writes disabled"), std::string::npos)
      << beat->reports_not_applied();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).restart_count(), 0);
  EXPECT_EQ(Job(id).workers(2).state(), v1::WORKER_STATE_RUNNING) << "the report was not applied";
  EXPECT_EQ(coord_->GetJobVersion(JobId(id))->second, version);

  EXPECT_EQ(coord_->CancelJob(JobId(id)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);

  v1::RegisterNodeRequest reg;
  reg.set_node_id("n3");
  reg.set_agent_address("127.0.0.1:9051");
  reg.set_incarnation("inc-n3");
  EXPECT_EQ(coord_->RegisterNode(reg).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(coord_->ListNodes().size(), 2u) << "n3 was not registered";
  // n2's agent restarts while writes fail: neither the job nor n2 changes.
  reg.set_node_id("n2");
  reg.set_incarnation("inc-n2-second");
  EXPECT_EQ(coord_->RegisterNode(reg).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Beat("n2").status().code() != absl::StatusCode::kAborted) << "old incarnation kept";
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);

  // Time-driven changes cannot be written either; they happen once writes
  // work again (n2 silent for a lease: its round fails then). n1's
  // heartbeats renew its lease all along.
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(seconds(1));
    auto n1 = Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING), Worker(1, v1::WORKER_STATE_RUNNING)});
    ASSERT_TRUE(n1.ok()) << n1.status();
    coord_->Tick();
  }
  ASSERT_EQ(coord_->ListNodes().size(), 2u);
  for (const auto& node : coord_->ListNodes()) {
    EXPECT_EQ(node.alive(), node.node_id() == "n1") << node.node_id();
  }
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(store_.jobs[id], before));
  store_.fail_writes = false;
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(Job(id).first_failure().reason().find("node n2 lost"), std::string::npos);
  EXPECT_EQ(store_.jobs[id].state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(coord_->GetJobVersion(JobId(id))->second, version + 1);
}

// A change is logged once it is written: while writes fail, the report
// that would fail the round is applied again at every heartbeat and the log
// says, at most every few seconds, that it was discarded; never that the
// job restarted. Once written, the change is logged once, with its rank.
TEST_F(CoordinatorTest, ChangesAreLoggedOnceWrittenNotWhileDiscarded) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/2);
  LogCapture log;
  store_.fail_writes = true;
  const std::vector<v1::WorkerStatus> exited = {Worker(2, v1::WORKER_STATE_EXITED, 1),
                                                Worker(3, v1::WORKER_STATE_RUNNING)};
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(milliseconds(300));
    ASSERT_TRUE(Beat("n2", id, 1, exited).ok());
  }
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  std::string lines = log.Lines();
  EXPECT_EQ(lines.find("RESTARTING round=1"), std::string::npos) << lines;
  const std::string discarded = absl::StrCat(
      "[coordinator] job=", id,
      " rank=- persisting the job failed, change (to RESTARTING) discarded (made again from the "
      "next report): UNAVAILABLE: fake job store: writes disabled");
  EXPECT_NE(lines.find(discarded), std::string::npos) << lines;
  EXPECT_EQ(lines.find(discarded, lines.find(discarded) + 1), std::string::npos)
      << "said more than once in a second: " << lines;

  store_.fail_writes = false;
  auto beat = Beat("n2", id, 1, exited);
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->reports_not_applied(), "");
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RESTARTING);
  lines = log.Lines();
  const std::string restarting = absl::StrCat("[coordinator] job=", id, " rank=2 RESTARTING round=1");
  EXPECT_NE(lines.find(restarting), std::string::npos) << lines;
  EXPECT_EQ(lines.find(restarting, lines.find(restarting) + 1), std::string::npos) << lines;
}

TEST_F(CoordinatorTest, StoreNamespacesOfOldRoundsAndEndedJobsAreDropped) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/1);
  EXPECT_TRUE(dropped_.empty());
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 1)}).ok());
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_EXITED, 1), Worker(1, v1::WORKER_STATE_STOPPED)});
  (void)Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_STOPPED), Worker(3, v1::WORKER_STATE_STOPPED)});
  EXPECT_TRUE(dropped_.empty()) << "round 1's owners are gone, but round 2 is not open yet";
  clock_.Advance(seconds(1));
  coord_->Tick();
  ASSERT_EQ(Job(id).round(), 2);
  EXPECT_EQ(dropped_, std::vector<std::string>{id + "/1"});
  ASSERT_TRUE(Beat("n2", id, 2, {Worker(3, v1::WORKER_STATE_EXITED, 7)}).ok());
  ASSERT_EQ(Job(id).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(dropped_, (std::vector<std::string>{id + "/1", id + "/"}));

  auto other = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "");
  ASSERT_TRUE(coord_->CancelJob(JobId(other->job_id())).ok());
  EXPECT_EQ(dropped_.back(), other->job_id() + "/");
  EXPECT_EQ(dropped_.size(), 3u);
}

// With close_store_job (lockstepd's), an ended job is closed rather than
// dropped by prefix; its store token opens nothing from then on, and a
// deleted or unknown job's none either.
TEST_F(CoordinatorTest, AnEndedJobsStoreIsClosedAndItsTokenRefused) {
  std::vector<std::string> closed;
  CoordinatorOptions options;
  options.lease = seconds(10);
  options.drop_store_prefix = [this](const std::string& prefix) { dropped_.push_back(prefix); };
  options.close_store_job = [&](const std::string& id) { closed.push_back(id); };
  coord_.reset();
  coord_ = std::make_unique<Coordinator>(options, &clock_, &store_);
  ASSERT_TRUE(coord_->Recover().ok());
  auto job = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "");
  ASSERT_TRUE(job.ok());
  const std::string id = job->job_id();
  EXPECT_TRUE(coord_->CheckStoreOpen(id).ok()) << "a pending job's workers may use the store";
  ASSERT_TRUE(coord_->CancelJob(JobId(id)).ok());
  EXPECT_EQ(closed, std::vector<std::string>{id});
  EXPECT_TRUE(dropped_.empty()) << "closing drops the namespaces itself";
  Status ended = coord_->CheckStoreOpen(id);
  EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition) << ended;
  EXPECT_NE(ended.message().find(id + "\" has ended (CANCELLED)"), std::string::npos) << ended;
  ASSERT_TRUE(coord_->DeleteJob(JobId(id)).ok());
  EXPECT_EQ(coord_->CheckStoreOpen(id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coord_->CheckStoreOpen("j-never").code(), absl::StatusCode::kFailedPrecondition);
  // After a restart, ended jobs stay closed (from coordinator.db).
  auto other = coord_->SubmitJob(TestSpec(1, 1, 1, 0), "");
  ASSERT_TRUE(coord_->CancelJob(JobId(other->job_id())).ok());
  coord_ = std::make_unique<Coordinator>(options, &clock_, &store_);
  ASSERT_TRUE(coord_->Recover().ok());
  EXPECT_EQ(coord_->CheckStoreOpen(other->job_id()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, StallOfTheCoordinatorCostsNoLease) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/0);
  // SIGSTOPped for 30 s, three leases: no agent could renew meanwhile.
  clock_.Advance(seconds(30));
  coord_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  for (const auto& n : coord_->ListNodes()) EXPECT_TRUE(n.alive()) << n.node_id();
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)}).ok());
  ASSERT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_RUNNING)}).ok());
  // A node that is really gone is still found, a lease after the stall.
  AdvanceTicking(seconds(10), seconds(1));
  (void)Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)});
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  AdvanceTicking(seconds(1), seconds(1));
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(Job(id).first_failure().reason().find("node n2 lost"), std::string::npos);
}

// The agents' heartbeats carry their send instant: exits of two nodes are
// ordered on the coordinator's clock whatever their wall clocks say.
TEST_F(CoordinatorTest, FirstFailureAcrossNodesUsesTheAgentsMonotonicTimes) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/3);
  const int64_t n1_clock = 3'000'000'000'000, n2_clock = 8'000'000'000'000;
  v1::WorkerStatus peer = Worker(0, v1::WORKER_STATE_EXITED, 1);
  peer.mutable_exit()->set_exited_mono_ns(n1_clock);
  peer.mutable_exit()->set_exited_unix_ms(clock_.UnixMillis() - 5000);  // a wall clock behind
  v1::WorkerStatus killed = Worker(2, v1::WORKER_STATE_EXITED, 0, 9);
  killed.mutable_exit()->set_exited_mono_ns(n2_clock);
  killed.mutable_exit()->set_exited_unix_ms(clock_.UnixMillis() + 5000);  // one ahead
  // Rank 2 died at T0 and rank 0 100 ms later; n1 reports at T0 + 200 ms,
  // n2 (slower) at T0 + 700 ms.
  clock_.Advance(milliseconds(200));
  ASSERT_TRUE(Beat("n1", id, 1, {peer}, "", 0, n1_clock + 100'000'000).ok());
  EXPECT_EQ(Job(id).first_failure().rank(), 0);
  clock_.Advance(milliseconds(500));
  ASSERT_TRUE(Beat("n2", id, 1, {killed}, "", 0, n2_clock + 700'000'000).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(j.restart_count(), 1);
  EXPECT_EQ(j.first_failure().rank(), 2);
  EXPECT_EQ(j.first_failure().exit().signal(), 9);
  ASSERT_EQ(j.consequences_size(), 1);
  EXPECT_EQ(j.consequences(0).rank(), 0);
  EXPECT_EQ(j.consequences(0).reason(), "after rank 2 failed");
  EXPECT_EQ(store_.jobs[id].consequences_size(), 1) << "persisted";
}

// A heartbeat that waited in a queue (a busy coordinator, a slow RPC) does
// not make its exits look later than a peer's: each node's clock offset is
// the smallest seen, so rank 0, killed first, stays the first failure
// although rank 2's exit, 100 ms later, was handled 300 ms earlier.
TEST_F(CoordinatorTest, AQueuedHeartbeatDoesNotMakeItsExitsLater) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/3);
  const int64_t n1_clock = 3'000'000'000'000, n2_clock = 8'000'000'000'000;
  const int64_t ms = 1'000'000;
  // Both agents heartbeat promptly once: the offsets are learnt.
  ASSERT_TRUE(Beat("n1", id, 1, {Worker(0, v1::WORKER_STATE_RUNNING)}, "", 0, n1_clock).ok());
  ASSERT_TRUE(Beat("n2", id, 1, {Worker(2, v1::WORKER_STATE_RUNNING)}, "", 0, n2_clock).ok());
  v1::WorkerStatus killed = Worker(0, v1::WORKER_STATE_EXITED, 0, 9);
  killed.mutable_exit()->set_exited_mono_ns(n1_clock + 1000 * ms);
  v1::WorkerStatus peer = Worker(2, v1::WORKER_STATE_EXITED, 1);
  peer.mutable_exit()->set_exited_mono_ns(n2_clock + 1100 * ms);
  clock_.Advance(milliseconds(1101));
  ASSERT_TRUE(Beat("n2", id, 1, {peer}, "", 0, n2_clock + 1101 * ms).ok());
  EXPECT_EQ(Job(id).first_failure().rank(), 2);
  // n1's report was sent at +1001 ms and handled at +1400 ms.
  clock_.Advance(milliseconds(299));
  ASSERT_TRUE(Beat("n1", id, 1, {killed}, "", 0, n1_clock + 1001 * ms).ok());
  v1::Job j = Job(id);
  EXPECT_EQ(j.first_failure().rank(), 0);
  EXPECT_EQ(j.first_failure().exit().signal(), 9);
  ASSERT_EQ(j.consequences_size(), 1);
  EXPECT_EQ(j.consequences(0).rank(), 2);
  EXPECT_EQ(j.restart_count(), 1) << "one failure, one restart";
}

// Every entry point from several threads at once, as gRPC and the ticker
// call them (run under --config=tsan by tools/check_threads.sh's rules).
TEST_F(CoordinatorTest, EntryPointsAreSafeToCallConcurrently) {
  std::string id = RunningTwoByTwo(/*max_restarts=*/1000);
  std::atomic<int> watched{0};
  auto beat = [&](const std::string& node, int first_rank) {
    for (int i = 0; i < 300; ++i) {
      int round = Job(id).round();
      (void)Beat(node, id, round, {Worker(first_rank, v1::WORKER_STATE_RUNNING),
                                   Worker(first_rank + 1, i % 50 == 49
                                                              ? v1::WORKER_STATE_EXITED
                                                              : v1::WORKER_STATE_RUNNING,
                                          1)});
    }
  };
  std::thread n1(beat, "n1", 0), n2(beat, "n2", 2);
  std::thread ticker([&] {
    for (int i = 0; i < 300; ++i) {
      clock_.Advance(milliseconds(10));
      coord_->Tick();
    }
  });
  std::thread reader([&] {
    for (int i = 0; i < 300; ++i) {
      (void)coord_->ListJobs({});
      (void)coord_->ListNodes();
      auto v = coord_->GetJobVersion(JobId(id));
      auto h = coord_->WatchOnce(JobId(id), v->second, [&](const v1::Job&, int64_t) { ++watched; });
      if (i % 2) (void)coord_->Unwatch(*h);
    }
  });
  n1.join();
  n2.join();
  ticker.join();
  reader.join();
  EXPECT_GT(Job(id).restart_count(), 0);
  EXPECT_GT(watched.load(), 0);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
