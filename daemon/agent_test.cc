#include "daemon/agent.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/log_capture.h"
#include "common/worker_link.h"
#include "daemon/fake_coordinator_client.h"
#include "daemon/orphans.h"
#include "daemon/uid_lease.h"

namespace lockstep {
namespace daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    state_dir_ = std::string(tmp ? tmp : "/tmp") + "/agent-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    launcher_ = NewPosixProcessLauncher();
    AgentOptions options = Options();
    // PWD and OLDPWD: the daemon's own shell leftovers, never a worker's.
    options.base_env = {"PATH=/usr/bin:/bin", "EXTRA=base", "PWD=/stale", "OLDPWD=/old"};
    agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  }
  // Node n1's options, as every agent of these tests has them.
  AgentOptions Options() const {
    AgentOptions options;
    options.node_id = "n1";
    options.hostname = "host1";
    options.agent_address = "127.0.0.1:5555";
    options.state_dir = state_dir_;
    options.allowed_env = {"JOBVAR"};
    return options;
  }
  ~AgentTest() override {
    // Shutdown's grace runs on the agent's clock: a fake one is moved on
    // meanwhile, so a test that failed with workers still up cannot hang here.
    std::atomic<bool> done{false};
    std::thread ticker;
    if (fake_) {
      ticker = std::thread([&] {
        while (!done) {
          fake_clock_.Advance(milliseconds(10));
          std::this_thread::sleep_for(milliseconds(10));
        }
      });
    }
    agent_->Shutdown(milliseconds(200));
    done = true;
    if (ticker.joinable()) ticker.join();
  }

  // Whether a heartbeat so far reported the end of `job`'s one worker
  // (neither starting nor running); that report into *out.
  bool ReportedEnd(const std::string& job, v1::WorkerStatus* out) {
    for (const auto& hb : coord_.heartbeats()) {
      for (const auto& r : hb.jobs()) {
        if (r.job_id() == job && r.workers_size() == 1 &&
            r.workers(0).state() != v1::WORKER_STATE_RUNNING &&
            r.workers(0).state() != v1::WORKER_STATE_STARTING) {
          *out = r.workers(0);
          return true;
        }
      }
    }
    return false;
  }

  // See its definition.
  v1::WorkerStatus ExitDuringTheStoppingHeartbeat(const std::string& job, ProcessLauncher* launcher,
                                                  const std::string& script, const std::string& go);

  // Replaces the agent by one on fake_clock_ (same options), for rules
  // that a real clock can check only within a margin.
  void UseFakeClock() {
    agent_->Shutdown(milliseconds(200));
    AgentOptions options = Options();
    options.base_env = {"PATH=/usr/bin:/bin"};
    fake_ = true;
    agent_ = std::make_unique<Agent>(options, &fake_clock_, launcher_.get(), &coord_);
  }

  static v1::AgentCommand Start(const std::string& job, int round, const std::string& script,
                                int nproc = 2, double grace = 5) {
    v1::AgentCommand cmd;
    cmd.set_kind(v1::AgentCommand::KIND_START);
    cmd.set_job_id(job);
    cmd.set_round(round);
    v1::JobSpec* spec = cmd.mutable_spec();
    spec->add_command("/bin/sh");
    spec->add_command("-c");
    spec->add_command(script);
    spec->set_min_nodes(2);
    spec->set_max_nodes(2);
    spec->set_nproc_per_node(nproc);
    spec->set_stop_grace_s(grace);
    (*spec->mutable_env())["JOBVAR"] = "jv";
    v1::RoundAssignment* a = cmd.mutable_assignment();
    a->set_job_id(job);
    a->set_round(round);
    a->set_node_rank(1);
    a->set_num_nodes(2);
    a->set_world_size(2 * nproc);
    a->set_nproc_per_node(nproc);
    a->set_master_addr("10.0.0.1");
    a->set_master_port(29511);
    a->set_store_address("127.0.0.1:7000");
    a->set_restart_count(round - 1);
    return cmd;
  }

  void Command(std::vector<v1::AgentCommand> cmds) {
    v1::HeartbeatResponse resp;
    for (auto& c : cmds) *resp.add_commands() = c;
    coord_.SetResponse(resp);
  }

  // Runs the agent loop until `pred` holds or 15 s pass.
  bool RunUntil(const std::function<bool()>& pred) {
    auto deadline = std::chrono::steady_clock::now() + seconds(15);
    while (std::chrono::steady_clock::now() < deadline) {
      agent_->RunOnce();
      if (pred()) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

  std::vector<v1::WorkerStatus> Workers(const std::string& job) {
    auto reports = agent_->ListWorkers(job);
    if (reports.empty()) return {};
    return {reports[0].workers().begin(), reports[0].workers().end()};
  }

  bool AllIn(const std::string& job, v1::WorkerState state, size_t n = 2) {
    auto ws = Workers(job);
    if (ws.size() != n) return false;
    for (auto& w : ws) {
      if (w.state() != state) return false;
    }
    return true;
  }

  std::string Output(const std::string& job, int rank) {
    auto chunk = agent_->ReadLogs(job, rank, false, 0, 0, 0);
    return chunk.ok() ? chunk->data : "";
  }

  std::string state_dir_;
  FakeClock fake_clock_;  // the agent's clock after UseFakeClock()
  bool fake_ = false;
  FakeCoordinatorClient coord_;
  std::unique_ptr<ProcessLauncher> launcher_;
  std::unique_ptr<Agent> agent_;
};

// Node rank 0 hosts MASTER_PORT: with none assigned, its agent picks a port
// that is free on the master address, hands it to its workers and reports
// it to the coordinator (which then starts the other nodes).
// The exit line says who ended a worker: a kill -9 from outside is not
// the worker exiting "on its own".
TEST(DescribeWorkerExitTest, SaysWhetherTheAgentStoppedTheWorker) {
  EXPECT_EQ(DescribeWorkerExit(0, 9, ExitCause::kItself),
            "killed by signal 9, not by the agent (by the worker itself or from outside)");
  EXPECT_EQ(DescribeWorkerExit(0, 9, ExitCause::kOomKiller),
            "killed by signal 9 by the kernel's OOM killer (out of memory)");
  EXPECT_EQ(DescribeWorkerExit(1, 0, ExitCause::kItself),
            "exited with code 1 by itself (not stopped by the agent)");
  EXPECT_EQ(DescribeWorkerExit(0, 15, ExitCause::kStoppedByAgent),
            "killed by signal 15 (stopped by the agent)");
  EXPECT_EQ(DescribeWorkerExit(0, 0, ExitCause::kStoppedByAgent),
            "exited with code 0 (stopped by the agent)");
  EXPECT_EQ(DescribeWorkerExit(0, 15, ExitCause::kGaveUpBeforeStop),
            "killed by signal 15 after its engine had given up on a lost peer, before the "
            "agent's stop (counted as its own exit)");
  EXPECT_EQ(DescribeWorkerExit(0, 9, ExitCause::kFenceGuard),
            "killed by signal 9 by this node's fence guard (the agent had not renewed its lease "
            "by the fence deadline: it was frozen or cut off)");
}

TEST_F(AgentTest, NodeRankZeroPicksAFreeMasterPortAndReportsIt) {
  v1::AgentCommand cmd = Start("j0", 1, "echo \"port=$MASTER_PORT\"");
  cmd.mutable_assignment()->set_node_rank(0);
  cmd.mutable_assignment()->set_master_addr("127.0.0.1");
  cmd.mutable_assignment()->set_master_port(0);
  Command({cmd});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j0", v1::WORKER_STATE_EXITED); }));
  const std::string out = Output("j0", 1);
  const auto at = out.find("port=");
  ASSERT_NE(at, std::string::npos) << out;
  const int port = std::atoi(out.c_str() + at + 5);
  EXPECT_GT(port, 0) << out;
  EXPECT_NE(Output("j0", 0).find("port=" + std::to_string(port)), std::string::npos)
      << "both local ranks get the same MASTER_PORT";
  ASSERT_TRUE(RunUntil([&] {
    for (const auto& hb : coord_.heartbeats()) {
      for (const auto& job : hb.jobs()) {
        if (job.job_id() == "j0" && job.master_port() == port) return true;
      }
    }
    return false;
  })) << "the chosen port never reached the coordinator";
  // Free on 127.0.0.1 now that the workers are gone.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
}

TEST_F(AgentTest, SpawnsWorkersWithTheWorkerEnvironment) {
  Command({Start("j1", 1,
                 "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
                 "$MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RESTART_COUNT\"; "
                 "echo \"$LOCKSTEP_JOB_ID $LOCKSTEP_RANK $LOCKSTEP_LOCAL_RANK "
                 "$LOCKSTEP_WORLD_SIZE $LOCKSTEP_LOCAL_WORLD_SIZE $LOCKSTEP_NODE_RANK "
                 "$LOCKSTEP_NUM_NODES $LOCKSTEP_ROUND $LOCKSTEP_RESTART_COUNT $LOCKSTEP_STORE "
                 "$LOCKSTEP_AGENT $LOCKSTEP_NODE_ADDR $JOBVAR $EXTRA\"")});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED); }));
  EXPECT_TRUE(agent_->registered());
  auto ws = Workers("j1");
  EXPECT_EQ(ws[0].rank(), 2);
  EXPECT_EQ(ws[1].rank(), 3);
  EXPECT_EQ(ws[1].exit().exit_code(), 0);
  std::string out = Output("j1", 3);
  EXPECT_NE(out.find("=== lockstep: job j1 round 1 rank 3"), std::string::npos) << out;
  EXPECT_NE(out.find("3 1 4 2 1 10.0.0.1 29511 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("j1 3 1 4 2 1 2 1 0 127.0.0.1:7000 127.0.0.1:5555 127.0.0.1 jv base\n"),
            std::string::npos)
      << out;
  // The exited state reaches the coordinator.
  ASSERT_TRUE(RunUntil([&] {
    auto hbs = coord_.heartbeats();
    if (hbs.empty() || hbs.back().jobs_size() != 1) return false;
    for (auto& w : hbs.back().jobs(0).workers()) {
      if (w.state() != v1::WORKER_STATE_EXITED) return false;
    }
    return true;
  }));
}

// torchrun's other variables, one OpenMP thread unless set, and the
// worker's own PWD (not the daemon's).
TEST_F(AgentTest, WorkersGetTorchrunsVariablesOneOmpThreadAndTheirOwnPwd) {
  v1::AgentCommand cmd = Start("j9", 1,
                               "echo \"$GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME "
                               "$TORCHELASTIC_MAX_RESTARTS $TORCHELASTIC_RUN_ID $OMP_NUM_THREADS\"; "
                               "echo \"pwd=$PWD cwd=$(pwd -P) oldpwd=${OLDPWD:-none}\"");
  cmd.mutable_spec()->set_max_restarts(3);
  Command({cmd});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j9", v1::WORKER_STATE_EXITED); }));
  const std::string out = Output("j9", 3);
  EXPECT_NE(out.find("2 3 4 default 3 j9 1\n"), std::string::npos) << out;
  const std::string dir = state_dir_ + "/jobs/j9";
  EXPECT_NE(out.find("pwd=" + dir + " cwd="), std::string::npos) << out;
  EXPECT_NE(out.find("oldpwd=none"), std::string::npos) << out;
  // A job that sets OMP_NUM_THREADS keeps its value.
  v1::AgentCommand omp = Start("j10", 1, "echo \"omp=$OMP_NUM_THREADS\"");
  (*omp.mutable_spec()->mutable_env())["OMP_NUM_THREADS"] = "4";
  Command({omp});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j10", v1::WORKER_STATE_EXITED); }));
  EXPECT_NE(Output("j10", 3).find("omp=4\n"), std::string::npos) << Output("j10", 3);
}

// With TLS the agent hands each worker the PEM it reads at that launch
// (LOCKSTEP_TLS_*_PEM); a read that fails fails the launch, saying why.
TEST_F(AgentTest, WorkersGetTheTlsMaterialReadAtEachLaunch) {
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = Options();
  int reads = 0;
  bool unreadable = false;
  options.worker_tls = [&]() -> StatusOr<WorkerTlsPem> {
    if (unreadable) return absl::UnavailableError("cannot read /etc/tls/n1.key for the workers");
    ++reads;
    return WorkerTlsPem{"CA" + std::to_string(reads), "CERT", "KEY"};
  };
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  Command({Start("t1", 1,
                 "echo \"tls=$LOCKSTEP_TLS_CA_PEM $LOCKSTEP_TLS_CERT_PEM $LOCKSTEP_TLS_KEY_PEM\"",
                 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("t1", v1::WORKER_STATE_EXITED, 1); }));
  EXPECT_NE(Output("t1", 1).find("tls=CA1 CERT KEY\n"), std::string::npos) << Output("t1", 1);
  unreadable = true;
  Command({Start("t2", 1, "true", 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("t2", v1::WORKER_STATE_EXITED, 1); }));
  EXPECT_NE(Workers("t2")[0].exit().message().find("/etc/tls/n1.key"), std::string::npos)
      << Workers("t2")[0].exit().message();
}

TEST_F(AgentTest, FailedWorkerReportsCodeStartupFailureAndLastLines) {
  Command({Start("j1", 1, "echo first >&2; echo \"bad rank $RANK\" >&2; exit 4", 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  v1::WorkerStatus w = Workers("j1")[0];
  EXPECT_EQ(w.exit().exit_code(), 4);
  // A program that does not use the engine is never a startup failure.
  EXPECT_FALSE(w.exit().startup_failure());
  ASSERT_EQ(w.exit().last_log_lines_size(), 2);
  EXPECT_EQ(w.exit().last_log_lines(1), "bad rank 1");
}

// A program that is not there is a launch error (the job fails at once),
// not a startup failure: it never reached the engine's bootstrap.
TEST_F(AgentTest, UnlaunchableCommandIsALaunchErrorWithTheReason) {
  v1::AgentCommand cmd = Start("j1", 1, "", 1);
  cmd.mutable_spec()->set_command(0, "/nonexistent/train");
  Command({cmd});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  v1::WorkerStatus w = Workers("j1")[0];
  EXPECT_EQ(w.exit().exit_code(), 127);
  EXPECT_TRUE(w.exit().launch_error());
  EXPECT_FALSE(w.exit().startup_failure());
  EXPECT_NE(w.exit().message().find("/nonexistent/train"), std::string::npos);
}

// This node's own refusal is as permanent as a missing program.
TEST_F(AgentTest, CommandOutsideTheAllowedListIsALaunchError) {
  AgentOptions options = Options();
  options.allowed_commands = {"/bin/true"};
  agent_->Shutdown(milliseconds(10));
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  Command({Start("j1", 1, "true", 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  v1::WorkerStatus w = Workers("j1")[0];
  EXPECT_TRUE(w.exit().launch_error());
  EXPECT_NE(w.exit().message().find("not in the allowed list"), std::string::npos)
      << w.exit().message();
}

// A launcher that fails as a node short of processes does.
class UnavailableLauncher : public ProcessLauncher {
 public:
  StatusOr<std::unique_ptr<Process>> Launch(const LaunchSpec& spec) override {
    return absl::UnavailableError(absl::StrCat("launch ", spec.argv[0], ": fork: no memory"));
  }
};

// Processes whose exit instant is stamped when they are reaped, as when
// the watcher thread that stamps it ran late (an agent that was frozen).
// With `seen_after_a_signal`, Poll also hides the exit until the first
// SignalGroup, as when that watcher ran only after the resumed agent's
// heartbeat had stopped the job.
class LateExitLauncher : public ProcessLauncher {
 public:
  LateExitLauncher(ProcessLauncher* inner, bool seen_after_a_signal)
      : inner_(inner), seen_after_a_signal_(seen_after_a_signal) {}
  StatusOr<std::unique_ptr<Process>> Launch(const LaunchSpec& spec) override {
    auto p = inner_->Launch(spec);
    if (!p.ok()) return p.status();
    return std::unique_ptr<Process>(std::make_unique<Late>(std::move(*p), seen_after_a_signal_));
  }

 private:
  class Late : public Process {
   public:
    Late(std::unique_ptr<Process> p, bool hidden) : p_(std::move(p)), hidden_(hidden) {}
    int64_t pid() const override { return p_->pid(); }
    std::optional<ExitStatus> Poll() override {
      if (hidden_) return std::nullopt;
      auto e = p_->Poll();
      if (e && !stamped_) stamped_ = std::chrono::steady_clock::now();
      if (e) e->exited_at = *stamped_;
      return e;
    }
    void SignalGroup(int sig) override {
      hidden_ = false;
      p_->SignalGroup(sig);
    }

   private:
    std::unique_ptr<Process> p_;
    bool hidden_;
    std::optional<std::chrono::steady_clock::time_point> stamped_;
  };
  ProcessLauncher* inner_;
  const bool seen_after_a_signal_;
};

bool IsZombie(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
}

// One worker of `job` (node rank 1 of 2: rank 1) runs `script`, which must print
// "ready" and then exit by itself once the file `go` exists. The worker
// exits while a heartbeat is in flight, and that heartbeat's answer stops
// the job. Returns the worker as the first heartbeat that reports it done
// saw it.
v1::WorkerStatus AgentTest::ExitDuringTheStoppingHeartbeat(const std::string& job,
                                                          ProcessLauncher* launcher,
                                                          const std::string& script,
                                                          const std::string& go) {
  agent_->Shutdown(milliseconds(10));
  agent_.reset();
  agent_ = std::make_unique<Agent>(Options(), RealClock(), launcher, &coord_);
  std::filesystem::remove(go);
  Command({Start(job, 1, script, 1)});
  EXPECT_TRUE(RunUntil([&] { return Output(job, 1).find("ready") != std::string::npos; }));
  if (Workers(job).size() != 1) {
    ADD_FAILURE() << "no worker of " << job;
    return {};
  }
  const int64_t pid = Workers(job)[0].pid();
  // The next heartbeat: the worker exits meanwhile, and the answer is that
  // this node no longer runs the job.
  Command({});
  std::atomic<bool> exited{false};
  coord_.SetOnHeartbeat([&] {
    if (exited) return;
    std::ofstream(go) << "go\n";
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (!IsZombie(pid) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    exited = true;
  });
  v1::WorkerStatus reported;
  EXPECT_TRUE(RunUntil([&] { return ReportedEnd(job, &reported); }));
  coord_.SetOnHeartbeat(nullptr);
  EXPECT_TRUE(exited) << "worker pid " << pid << " did not exit during the heartbeat";
  agent_->Shutdown(milliseconds(10));
  agent_ = std::make_unique<Agent>(Options(), RealClock(), launcher_.get(), &coord_);
  return reported;
}

// A worker exits on its own (code 3) during the heartbeat whose answer
// stops the job, and its exit instant is stamped only when it is reaped,
// after that answer (as for an agent resumed from SIGSTOP). The exit is
// still the worker's own: EXITED with its code, not STOPPED. (The e2e
// first_failure test's frozen agent listed such a rank 0 as stopped by the
// agent, so it was no consequence that had lost a peer.)
TEST_F(AgentTest, WorkerThatExitedBeforeTheStopIsNotCountedAsStopped) {
  LateExitLauncher late(launcher_.get(), /*seen_after_a_signal=*/false);
  const std::string go = state_dir_ + "-go";
  v1::WorkerStatus w = ExitDuringTheStoppingHeartbeat(
      "j1", &late, absl::StrCat("echo ready; while [ ! -e ", go, " ]; do sleep 0.01; done; exit 3"), go);
  EXPECT_EQ(w.state(), v1::WORKER_STATE_EXITED)
      << "an exit before the stop counted as the agent's: " << w.DebugString();
  EXPECT_EQ(w.exit().exit_code(), 3);
}

// The same exit, seen by the agent only after it signalled the stop (its
// watcher thread ran late). Only the worker knows when it ended: one that
// stamped it on its status page (worker_link.h; the engine does, and
// exiting_worker) is EXITED with its code, placed at its own instant; a
// program that never touched the page is counted as stopped.
TEST_F(AgentTest, AnExitSeenAfterTheStopIsTheWorkersOwnWhenItStampedIt) {
  LateExitLauncher seen_late(launcher_.get(), /*seen_after_a_signal=*/true);
  const std::string go = state_dir_ + "-go";
  const std::string worker = std::filesystem::absolute("daemon/exiting_worker").string();
  ASSERT_TRUE(std::filesystem::exists(worker)) << worker;
  const int64_t before = worker_link::MonotonicNowNs();
  v1::WorkerStatus w =
      ExitDuringTheStoppingHeartbeat("j1", &seen_late, absl::StrCat("exec ", worker, " ", go, " 3"), go);
  EXPECT_EQ(w.state(), v1::WORKER_STATE_EXITED)
      << "an exit the worker stamped before the stop counted as the agent's: " << w.DebugString();
  EXPECT_EQ(w.exit().exit_code(), 3);
  EXPECT_EQ(w.exit().signal(), 0);
  EXPECT_GT(w.exit().exited_mono_ns(), before);

  v1::WorkerStatus unstamped = ExitDuringTheStoppingHeartbeat(
      "j2", &seen_late, absl::StrCat("echo ready; while [ ! -e ", go, " ]; do sleep 0.01; done; exit 3"),
      go);
  EXPECT_EQ(unstamped.state(), v1::WORKER_STATE_STOPPED) << unstamped.DebugString();
}

// A worker whose engine gave up on a lost peer (it marked its slot, which
// stamps when it began to end) is still finishing when the job's stop
// arrives, and the stop's SIGTERM kills it. It was ending on its own: it
// is EXITED, a consequence naming the rank it lost, not STOPPED. One that
// gave up only once the stop came (in its SIGTERM handler) was stopped.
TEST_F(AgentTest, AWorkerThatGaveUpBeforeTheStopIsAConsequenceNotStopped) {
  const std::string worker = std::filesystem::absolute("daemon/exiting_worker").string();
  ASSERT_TRUE(std::filesystem::exists(worker)) << worker;
  auto stopped_run = [&](const std::string& job, const std::string& mode) -> v1::WorkerStatus {
    Command({Start(job, 1, absl::StrCat("exec ", worker, " ", mode, " 0"), 1)});
    EXPECT_TRUE(RunUntil([&] { return Output(job, 1).find("ready") != std::string::npos; }))
        << job << ": " << Output(job, 1);
    v1::AgentCommand stop;
    stop.set_kind(v1::AgentCommand::KIND_STOP);
    stop.set_job_id(job);
    stop.set_round(1);
    Command({stop});
    // The run is gone once its worker is: read the exit from the heartbeat
    // that reported it.
    v1::WorkerStatus reported;
    EXPECT_TRUE(RunUntil([&] { return ReportedEnd(job, &reported); }))
        << job << ": no heartbeat reported its worker's end";
    return reported;
  };
  LogCapture log;
  const v1::WorkerStatus gave_up = stopped_run("j1", "--gave-up");
  EXPECT_EQ(gave_up.state(), v1::WORKER_STATE_EXITED)
      << "a worker that had given up before the stop counted as stopped: " << gave_up.DebugString();
  EXPECT_EQ(gave_up.exit().signal(), SIGTERM);
  EXPECT_TRUE(gave_up.exit().peer_lost());
  EXPECT_EQ(gave_up.exit().lost_peer(), 0);
  EXPECT_NE(log.Lines().find("killed by signal 15 after its engine had given up on a lost peer, "
                             "before the agent's stop (counted as its own exit)"),
            std::string::npos)
      << log.Lines();

  const v1::WorkerStatus at_stop = stopped_run("j2", "--gives-up-when-stopped");
  EXPECT_EQ(at_stop.state(), v1::WORKER_STATE_STOPPED)
      << "a worker that gave up only when stopped counted as its own exit: "
      << at_stop.DebugString();
  EXPECT_EQ(at_stop.exit().signal(), SIGTERM);
  EXPECT_FALSE(at_stop.exit().peer_lost());
}

TEST_F(AgentTest, TransientLaunchFailureIsNotALaunchError) {
  AgentOptions options = Options();
  agent_->Shutdown(milliseconds(10));
  agent_.reset();
  launcher_ = std::make_unique<UnavailableLauncher>();
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  Command({Start("j1", 1, "true", 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  v1::WorkerStatus w = Workers("j1")[0];
  EXPECT_EQ(w.exit().exit_code(), 127);
  EXPECT_FALSE(w.exit().launch_error()) << "a restart may find the node able to fork";
  EXPECT_FALSE(w.exit().startup_failure());
  EXPECT_NE(w.exit().message().find("fork: no memory"), std::string::npos);
}

// The agent checks the job environment too (with its own --allowed-env):
// a variable it does not permit is a launch error, never run.
TEST_F(AgentTest, JobEnvironmentOutsideTheAllowListIsALaunchError) {
  v1::AgentCommand cmd = Start("j1", 1, "echo ran", 1);
  (*cmd.mutable_spec()->mutable_env())["LD_PRELOAD"] = "/tmp/evil.so";
  Command({cmd});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  v1::WorkerStatus w = Workers("j1")[0];
  EXPECT_TRUE(w.exit().launch_error());
  EXPECT_NE(w.exit().message().find("spec.env: LD_PRELOAD is refused"), std::string::npos)
      << w.exit().message();
  EXPECT_EQ(Output("j1", 1).find("ran"), std::string::npos);
}

TEST_F(AgentTest, SpecCannotPickAnotherUserThanTheDaemonsRunAs) {
  AgentOptions options = Options();
  options.run_as = "nobody";
  agent_->Shutdown(milliseconds(10));
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  v1::AgentCommand cmd = Start("j1", 1, "true", 1);
  cmd.mutable_spec()->set_run_as("daemon");
  Command({cmd});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  EXPECT_NE(Workers("j1")[0].exit().message().find("only as \"nobody\""), std::string::npos)
      << Workers("j1")[0].exit().message();
}

TEST_F(AgentTest, UnassignedJobIsStoppedWithTermThenKillAfterGrace) {
  // The workers ignore SIGTERM: only SIGKILL after the 0.3 s grace ends them.
  Command({Start("j1", 1, "trap '' TERM; echo ready; while true; do sleep 0.05; done", 2, 0.3)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_STARTING); }));
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 2).find("ready") != std::string::npos; }));
  auto start = std::chrono::steady_clock::now();
  Command({});
  // The agent may forget the job right after reporting it stopped: look at
  // what it reported.
  std::vector<v1::WorkerStatus> stopped;
  auto reported_stopped = [&] {
    for (const auto& hb : coord_.heartbeats()) {
      for (const auto& r : hb.jobs()) {
        if (r.job_id() != "j1" || r.workers_size() != 2) continue;
        if (r.workers(0).state() == v1::WORKER_STATE_STOPPED &&
            r.workers(1).state() == v1::WORKER_STATE_STOPPED) {
          stopped.assign(r.workers().begin(), r.workers().end());
          return true;
        }
      }
    }
    return false;
  };
  ASSERT_TRUE(RunUntil(reported_stopped));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(250));
  EXPECT_LT(took, seconds(5));
  for (auto& w : stopped) {
    EXPECT_EQ(w.exit().signal(), SIGKILL);
    EXPECT_NE(::kill(w.pid(), 0), 0);
  }
  // Once the final state was reported the job is forgotten.
  ASSERT_TRUE(RunUntil([&] { return agent_->ListWorkers("j1").empty(); }));
}

// What the engine does (common/worker_link.h), done by hand: mark this
// worker's slot of the status page through /proc.
constexpr char kMarkSlot[] =
    "mark() { printf \"\\00$1\\000\\000\\000\" | dd of=/proc/self/fd/$LOCKSTEP_STATUS_FD bs=4 "
    "seek=$LOCKSTEP_LOCAL_RANK conv=notrunc status=none; }; ";

TEST_F(AgentTest, StartupFailureMeansDiedInsideTheEnginesBootstrap) {
  // Local rank 0 dies inside the bootstrap; local rank 1 after it ended.
  Command({Start("j1", 1,
                 std::string(kMarkSlot) +
                     "mark 1; if [ $LOCKSTEP_LOCAL_RANK = 1 ]; then mark 2; fi; exit 3",
                 2)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED); }));
  auto ws = Workers("j1");
  ASSERT_EQ(ws[0].local_rank(), 0);
  EXPECT_EQ(ws[0].exit().exit_code(), 3);
  EXPECT_TRUE(ws[0].exit().startup_failure());
  EXPECT_FALSE(ws[1].exit().startup_failure());
}

// The page holds S + lease + lease/4 (2.5 s here) for the latest accepted
// renewal S. The agent runs on the real monotonic clock, so S is pinned by
// the RunOnce call that made the renewal: the page, less 2.5 s, must fall
// inside one such call, whenever the worker happened to read it.
TEST_F(AgentTest, EachRenewalMovesTheFenceDeadlineWorkersSee) {
  coord_.SetLease(2.0);
  constexpr int64_t kFenceNs = int64_t{2500} * 1000000;  // lease + lease/4
  // The worker reads its fence page twice, 1.5 s apart (heartbeats every 50 ms).
  Command({Start("j1", 1,
                 "r() { od -An -t d8 -N8 /proc/self/fd/$LOCKSTEP_FENCE_FD | tr -d ' '; }; "
                 "echo \"a $(r)\"; sleep 1.5; echo \"b $(r)\"; exit 0",
                 1)});
  // [start, end] of each RunOnce call during which a renewal was sent.
  std::vector<std::pair<int64_t, int64_t>> renewals;
  const auto renewals_sent = [&] {
    return coord_.heartbeats().size() + coord_.registrations().size();
  };
  const auto deadline = std::chrono::steady_clock::now() + seconds(15);
  while (!AllIn("j1", v1::WORKER_STATE_EXITED, 1)) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the worker did not exit in 15 s";
    const size_t before = renewals_sent();
    const int64_t start = worker_link::MonotonicNowNs();
    agent_->RunOnce();
    const int64_t end = worker_link::MonotonicNowNs();
    if (renewals_sent() > before) renewals.emplace_back(start, end);
    std::this_thread::sleep_for(milliseconds(10));
  }
  std::vector<std::string> lines = absl::StrSplit(Output("j1", 1), '\n', absl::SkipEmpty());
  int64_t a = 0, b = 0;
  for (const auto& l : lines) {
    if (l.rfind("a ", 0) == 0) a = std::stoll(l.substr(2));
    if (l.rfind("b ", 0) == 0) b = std::stoll(l.substr(2));
  }
  // Index of the renewal whose RunOnce call contains `page` - 2.5 s, or -1.
  const auto renewal_of = [&](int64_t page) {
    for (size_t i = 0; i < renewals.size(); ++i) {
      if (renewals[i].first <= page - kFenceNs && page - kFenceNs <= renewals[i].second) {
        return static_cast<int>(i);
      }
    }
    return -1;
  };
  const int ia = renewal_of(a);
  const int ib = renewal_of(b);
  ASSERT_GE(ia, 0) << "first read " << a << " is no renewal + 2.5 s (" << renewals.size()
                   << " renewals, from " << renewals.front().first << ")\n" << Output("j1", 1);
  ASSERT_GE(ib, 0) << "second read " << b << " is no renewal + 2.5 s\n" << Output("j1", 1);
  EXPECT_GT(ib, ia) << "the renewals in the 1.5 s between the reads did not move the deadline";
}

// On a FakeClock the rule is pinned to the nanosecond: a lease (1 s) after
// the last accepted renewal S the workers get SIGTERM, lease/4 later
// (their grace, capped) SIGKILL; so they are gone by S + 1.25 s, before the
// coordinator's fence deadline (S + lease + lease/4 + 1 s).
TEST_F(AgentTest, SelfFencesWhenTheLeaseCannotBeRenewed) {
  UseFakeClock();
  coord_.SetLease(1.0);
  // Workers that survive SIGTERM (and say so): only the SIGKILL ends them.
  Command({Start("j1", 1,
                 "trap 'echo got-TERM' TERM; echo trapped; "
                 "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.05; done",
                 2, 5)});
  ASSERT_TRUE(RunUntil([&] {
    return AllIn("j1", v1::WORKER_STATE_STARTING) &&
           Output("j1", 2).find("trapped") != std::string::npos &&
           Output("j1", 3).find("trapped") != std::string::npos;
  })) << "workers did not start and trap TERM";
  // One more accepted renewal, at S.
  fake_clock_.Advance(milliseconds(100));
  const size_t beats = coord_.heartbeats().size();
  agent_->RunOnce();
  ASSERT_GT(coord_.heartbeats().size(), beats) << "no heartbeat 100 ms after the last one";
  const MonoTime s = fake_clock_.Now();
  coord_.SetFailure(absl::UnavailableError("coordinator unreachable"));
  // Both workers print two more ticks: any signal sent before (by the
  // RunOnce above) has been handled by then, its trap's line printed first.
  const auto two_more_ticks_without_term = [&](const std::string& when) {
    for (int rank : {2, 3}) {
      const std::string out = Output("j1", rank);
      const size_t at = out.rfind("tick ");
      ASSERT_NE(at, std::string::npos) << out;
      const int ticks = std::atoi(out.c_str() + at + 5);
      const std::string next = "tick " + std::to_string(ticks + 2) + "\n";
      ASSERT_TRUE(RunUntil([&] { return Output("j1", rank).find(next) != std::string::npos; }))
          << "rank " << rank << " stopped ticking " << when << "\n" << Output("j1", rank);
      EXPECT_EQ(Output("j1", rank).find("got-TERM"), std::string::npos)
          << "rank " << rank << " got SIGTERM " << when;
    }
  };
  const Duration lease = seconds(1);
  fake_clock_.Advance(s + lease - fake_clock_.Now());
  agent_->RunOnce();
  two_more_ticks_without_term("exactly a lease after the last renewal");
  if (HasFatalFailure()) return;
  fake_clock_.Advance(nanoseconds(1));
  agent_->RunOnce();  // the lease has passed: SIGTERM
  ASSERT_TRUE(RunUntil([&] {
    return Output("j1", 2).find("got-TERM") != std::string::npos &&
           Output("j1", 3).find("got-TERM") != std::string::npos;
  })) << "no SIGTERM once the lease had passed\n" << Output("j1", 2) << Output("j1", 3);
  const MonoTime kill_at = fake_clock_.Now() + lease / 4;
  fake_clock_.Advance(kill_at - nanoseconds(1) - fake_clock_.Now());
  agent_->RunOnce();
  for (int rank : {2, 3}) {
    const std::string out = Output("j1", rank);
    const int ticks = std::atoi(out.c_str() + out.rfind("tick ") + 5);
    const std::string next = "tick " + std::to_string(ticks + 2) + "\n";
    ASSERT_TRUE(RunUntil([&] { return Output("j1", rank).find(next) != std::string::npos; }))
        << "rank " << rank << " was killed before its lease/4 grace ended\n" << out;
  }
  fake_clock_.Advance(nanoseconds(1));
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_STOPPED); }))
      << "workers not stopped when their lease/4 grace ended";
  for (const auto& w : Workers("j1")) EXPECT_EQ(w.exit().signal(), SIGKILL) << w.rank();
  // RunUntil does not move the fake clock: they were gone at kill_at.
  EXPECT_EQ(fake_clock_.Now(), s + lease + lease / 4 + nanoseconds(1));
  EXPECT_LT(fake_clock_.Now(), s + lease + lease / 4 + seconds(1))
      << "not gone before the coordinator's fence deadline";
}

TEST_F(AgentTest, NewRoundStartsOnlyAfterOldWorkersAreGone) {
  // "trapped" is printed once the shell has installed its trap.
  Command({Start("j1", 1, "trap 'sleep 0.3; exit 0' TERM; echo trapped; while true; do sleep 0.05; done", 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_STARTING, 1); }));
  int64_t old_pid = Workers("j1")[0].pid();
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 1).find("trapped") != std::string::npos; }));
  Command({Start("j1", 2, "echo round $LOCKSTEP_ROUND; sleep 60", 1)});
  bool overlapped = false;
  ASSERT_TRUE(RunUntil([&] {
    auto reports = agent_->ListWorkers("j1");
    if (reports.empty() || reports[0].round() != 2) return false;
    if (::kill(old_pid, 0) == 0 && ::waitpid(old_pid, nullptr, WNOHANG) == 0) overlapped = true;
    return reports[0].workers(0).state() == v1::WORKER_STATE_STARTING;
  }));
  EXPECT_FALSE(overlapped);
  EXPECT_NE(Workers("j1")[0].pid(), old_pid);
}

// A deleted job's directory goes at once if nothing of it runs here, and
// the next accepted heartbeat acknowledges it (until then every heartbeat,
// failed ones included, carries the id); one still running keeps its
// directory, unacknowledged, until its workers are gone.
TEST_F(AgentTest, DeletedJobDirectoriesAreRemovedAndAcknowledgedOnceNothingRunsThere) {
  namespace fs = std::filesystem;
  const fs::path old_dir = fs::path(state_dir_) / "jobs" / "j0";
  fs::create_directories(old_dir);
  std::ofstream(old_dir / "rank-0.stdout") << "an earlier job's log\n";
  Command({Start("j1", 1, "echo up; while true; do sleep 0.05; done", 1, 0.2)});
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 1).find("up") != std::string::npos; }));
  const fs::path running_dir = fs::path(state_dir_) / "jobs" / "j1";
  ASSERT_TRUE(fs::exists(running_dir));

  auto acks = [](const v1::HeartbeatRequest& hb, const std::string& id) {
    return std::find(hb.removed_job_ids().begin(), hb.removed_job_ids().end(), id) !=
           hb.removed_job_ids().end();
  };
  // The coordinator deletes j0 and j1 while j1 still runs here; j1 is still
  // assigned, so it keeps running.
  v1::HeartbeatResponse resp;
  *resp.add_commands() = Start("j1", 1, "echo up; while true; do sleep 0.05; done", 1, 0.2);
  resp.add_deleted_job_ids("j0");
  resp.add_deleted_job_ids("j1");
  coord_.SetResponse(resp);
  ASSERT_TRUE(RunUntil([&] {
    auto hbs = coord_.heartbeats();
    return !hbs.empty() && !fs::exists(old_dir) && acks(hbs.back(), "j0");
  }));
  for (const auto& hb : coord_.heartbeats()) {
    EXPECT_TRUE(hb.acks_deleted_job_ids());
    EXPECT_FALSE(acks(hb, "j1")) << "acknowledged a job that still runs here";
  }
  EXPECT_TRUE(fs::exists(running_dir)) << "removed the directory of a job still running";
  EXPECT_TRUE(AllIn("j1", v1::WORKER_STATE_STARTING, 1));

  // Its acknowledgment lost (the coordinator unreachable): every heartbeat
  // carries j0 until one is accepted, then none does.
  coord_.SetFailure(absl::UnavailableError("coordinator down"));
  size_t before = coord_.heartbeats().size();
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= before + 2; }));
  for (size_t i = before; i < coord_.heartbeats().size(); ++i) {
    EXPECT_TRUE(acks(coord_.heartbeats()[i], "j0")) << "heartbeat " << i;
  }
  // j1 is no longer assigned (still deleted): its workers stop, and only
  // then does its directory go and get acknowledged.
  v1::HeartbeatResponse deleted_only;
  deleted_only.add_deleted_job_ids("j1");
  coord_.SetResponse(deleted_only);
  coord_.SetFailure(absl::OkStatus());
  ASSERT_TRUE(RunUntil([&] {
    auto hbs = coord_.heartbeats();
    return !hbs.empty() && !fs::exists(running_dir) && acks(hbs.back(), "j1");
  }));
  EXPECT_TRUE(agent_->ListWorkers("j1").empty());
  coord_.SetResponse(v1::HeartbeatResponse());
  before = coord_.heartbeats().size();
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= before + 3; }));
  const auto last = coord_.heartbeats().back();
  EXPECT_EQ(last.removed_job_ids_size(), 0) << "an accepted acknowledgment was sent again";
}

// A deleted job's dir is removed on the cleaner's thread: while that is
// held (as a dir of a million files would hold it) the agent goes on
// heartbeating, and acknowledges the deletion only once the dir is gone.
TEST_F(AgentTest, ADeletedJobsDirIsRemovedOffTheLoopThreadAndAcknowledgedWhenGone) {
  namespace fs = std::filesystem;
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool holding = true;
  std::vector<std::string> seen;
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = Options();
  options.heartbeat_interval = milliseconds(50);
  options.before_clean = [&](const std::string& what) {
    std::unique_lock<std::mutex> lock(hold_mu);
    seen.push_back(what);
    hold_cv.wait(lock, [&] { return !holding; });
  };
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  const fs::path dir = fs::path(state_dir_) / "jobs" / "j0";
  fs::create_directories(dir / "deep" / "er");
  std::ofstream(dir / "rank-0.stdout") << "its log\n";
  std::ofstream(dir / "deep" / "er" / "f") << "its data\n";
  auto acked = [&] {
    for (const auto& hb : coord_.heartbeats()) {
      for (const auto& id : hb.removed_job_ids()) {
        if (id == "j0") return true;
      }
    }
    return false;
  };
  v1::HeartbeatResponse resp;
  resp.add_deleted_job_ids("j0");
  coord_.SetResponse(resp);
  ASSERT_TRUE(RunUntil([&] {
    std::lock_guard<std::mutex> lock(hold_mu);
    return !seen.empty();
  }));
  EXPECT_EQ(seen[0], dir.string());
  const size_t beats = coord_.heartbeats().size();
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= beats + 10; }))
      << "the agent stopped heartbeating while a job dir was removed";
  EXPECT_FALSE(acked()) << "acknowledged before the dir was gone";
  EXPECT_TRUE(fs::exists(dir / "deep" / "er" / "f"));
  // The coordinator repeated the deletion in every response meanwhile; it
  // stops now (as it would once acknowledged), and the dir goes.
  coord_.SetResponse(v1::HeartbeatResponse());
  {
    std::lock_guard<std::mutex> lock(hold_mu);
    holding = false;
  }
  hold_cv.notify_all();
  ASSERT_TRUE(RunUntil([&] { return acked(); }));
  EXPECT_FALSE(fs::exists(dir));
  const size_t after = coord_.heartbeats().size();
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= after + 3; }));
  std::lock_guard<std::mutex> lock(hold_mu);
  EXPECT_EQ(seen.size(), 1u) << "the repeated deletion was queued again while one was under way";
}

TEST_F(AgentTest, ProgressNeedsTheRunTokenAndCurrentRound) {
  Command({Start("j1", 1, "echo token=$LOCKSTEP_AGENT_TOKEN; sleep 60", 1)});
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 1).find("token=") != std::string::npos; }));
  std::string out = Output("j1", 1);
  std::string token = out.substr(out.find("token=") + 6);
  token = token.substr(0, token.find('\n'));
  v1::RankProgress p;
  p.set_rank(1);
  p.set_step(7);
  p.set_loss(0.5);
  // A CSPRNG secret: "pt-" and 64 hex digits.
  EXPECT_EQ(token.size(), 3u + 64u) << token;
  const Status wrong = agent_->ReportProgress("j1", 1, "wrong", p);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(agent_->ReportProgress("j1", 0, token, p).code(), absl::StatusCode::kAborted);
  // An unknown job answers exactly like a wrong token: no oracle for which
  // jobs run here.
  const Status unknown = agent_->ReportProgress("jx", 1, token, p);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(unknown.message(), wrong.message());
  ASSERT_TRUE(agent_->ReportProgress("j1", 1, token, p).ok());
  auto w = Workers("j1")[0];
  EXPECT_EQ(w.state(), v1::WORKER_STATE_RUNNING);
  EXPECT_EQ(w.progress().step(), 7);

  // A report too big for the heartbeats that carry it (one of 64 MiB cut
  // the node off for good: every heartbeat after it was over the message
  // limit), or naming no collective, is refused; the last good one stays.
  v1::RankProgress huge = p;
  huge.set_step(8);
  huge.set_collective_op(std::string(63 << 20, 'a'));
  Status refused = agent_->ReportProgress("j1", 1, token, huge);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StartsWith(refused.message(), "progress of rank 1: ")) << refused;
  huge.set_collective_op("allreduce");
  for (int i = 0; i < 10000; ++i) huge.add_bucket_wait_ms(1.5);
  refused = agent_->ReportProgress("j1", 1, token, huge);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("exceeds the limit of 65536 bytes"), std::string::npos) << refused;
  huge.clear_bucket_wait_ms();
  huge.set_collective_op("all\x1b[2Jreduce");
  refused = agent_->ReportProgress("j1", 1, token, huge);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message().find('\x1b'), std::string::npos) << refused;
  EXPECT_EQ(Workers("j1")[0].progress().step(), 7) << "a refused report replaced the last good one";
  ASSERT_TRUE(RunUntil([&] {
    auto hbs = coord_.heartbeats();
    return !hbs.empty() && hbs.back().jobs_size() == 1 &&
           hbs.back().jobs(0).workers(0).progress().step() == 7;
  }));
}

TEST_F(AgentTest, ShutdownFromTheLoopThreadGivesWorkersTheirGrace) {
  Command({Start("j1", 1, "trap 'echo got TERM; exit 0' TERM; echo up; while true; do sleep 0.05; done", 1)});
  agent_->Start();
  auto deadline = std::chrono::steady_clock::now() + seconds(15);
  while (Output("j1", 1).find("up") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  // "up" is printed after the trap is installed.
  ASSERT_NE(Output("j1", 1).find("up"), std::string::npos);
  agent_->Shutdown(seconds(5));
  EXPECT_NE(Output("j1", 1).find("got TERM"), std::string::npos)
      << "the worker was killed without its SIGTERM grace";
  EXPECT_EQ(Workers("j1")[0].state(), v1::WORKER_STATE_STOPPED);
}

// The fence guard (fence_guard.h) is the agent's process's one child while
// no worker runs; one that ends is started again at the next housekeeping,
// and the agent says so.
TEST_F(AgentTest, AFenceGuardThatEndsIsStartedAgain) {
  LogCapture log;
  std::vector<pid_t> children = ChildrenOf(::getpid());
  ASSERT_EQ(children.size(), 1u) << "the fence guard is not this agent's one child";
  const pid_t guard = children[0];
  EXPECT_EQ(::getpgid(guard), guard) << "the guard is in its process group";
  ::kill(guard, SIGKILL);
  ASSERT_TRUE(RunUntil([&] { return log.Lines().find("started another") != std::string::npos; }))
      << log.Lines();
  EXPECT_NE(log.Lines().find(absl::StrCat("the fence guard (pid ", guard,
                                          ") killed by signal 9: started another (pid ")),
            std::string::npos)
      << log.Lines();
  children = ChildrenOf(::getpid());
  ASSERT_EQ(children.size(), 1u);
  EXPECT_NE(children[0], guard);
  EXPECT_EQ(::getpgid(children[0]), children[0]);
}

TEST_F(AgentTest, ReadLogsRejectsPathsAndUnknownRanks) {
  EXPECT_EQ(agent_->ReadLogs("../../etc", 0, false, 0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agent_->ReadLogs("j1/../../x", 0, false, 0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agent_->ReadLogs("j1", -1, false, 0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agent_->ReadLogs("j1", 9, false, 0, 0, 0).status().code(),
            absl::StatusCode::kNotFound);
}

// A memory cgroup of `limit` bytes (no swap) that a worker can join by
// writing its pid to `<path>/cgroup.procs`; empty where this process cannot
// make one (not root, no memory controller it may use). cgroup v2 (a child
// of the root cgroup, whose controllers are enabled there) or v1 (a child of
// this process's memory cgroup).
std::string MakeMemoryCgroup(int64_t limit) {
  if (::geteuid() != 0) return "";
  const std::string name = absl::StrCat("lockstep-agent-test-oom-", ::getpid());
  auto write = [](const std::string& path, const std::string& value) {
    std::ofstream out(path);
    out << value;
    out.flush();
    return static_cast<bool>(out);
  };
  // The cgroup at `path`, limited through `limit_file`, without swap
  // through `swap_file` (best effort); empty if it cannot be made.
  auto make = [&](const std::string& path, const char* limit_file, const char* swap_file) {
    if (::mkdir(path.c_str(), 0755) != 0) return std::string();
    if (!write(path + "/" + limit_file, std::to_string(limit))) {
      ::rmdir(path.c_str());
      return std::string();
    }
    (void)write(path + "/" + swap_file, "0");
    return path;
  };
  std::ifstream controllers("/sys/fs/cgroup/cgroup.controllers");
  std::string line;
  if (std::getline(controllers, line) && line.find("memory") != std::string::npos) {
    (void)write("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
    return make("/sys/fs/cgroup/" + name, "memory.max", "memory.swap.max");
  }
  std::ifstream self("/proc/self/cgroup");
  while (std::getline(self, line)) {
    const size_t at = line.find(":memory:");
    if (at == std::string::npos) continue;
    return make("/sys/fs/cgroup/memory" + line.substr(at + 8) + "/" + name, "memory.limit_in_bytes",
                "memory.swappiness");
  }
  return "";
}

// A worker the kernel's OOM killer kills (here its memory cgroup's limit,
// as a container's would be) is reported so, not as a SIGKILL "from
// outside": its exit says oom_killed and the agent's line says why.
TEST_F(AgentTest, AWorkerTheOomKillerKilledIsReportedSo) {
  // The kernel log must be readable (a container may refuse it even to root).
  const int kmsg = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  char record[8192];
  const bool readable = kmsg >= 0 && (::read(kmsg, record, sizeof(record)) > 0 || errno == EAGAIN);
  if (kmsg >= 0) ::close(kmsg);
  if (!readable) GTEST_SKIP() << "needs to read the kernel log (/dev/kmsg)";
  const std::string cgroup = MakeMemoryCgroup(64 << 20);
  if (cgroup.empty()) GTEST_SKIP() << "needs root and a memory cgroup it can make";
  LogCapture log;
  Command({Start("j1", 1,
                 absl::StrCat("echo $$ > ", cgroup, "/cgroup.procs && "
                              "exec python3 -c 'x = bytearray(512 << 20); print(len(x))'"),
                 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }))
      << "the worker did not end";
  const v1::WorkerStatus w = Workers("j1")[0];
  ::rmdir(cgroup.c_str());
  EXPECT_EQ(w.exit().signal(), SIGKILL);
  EXPECT_TRUE(w.exit().oom_killed()) << log.Lines();
  EXPECT_NE(log.Lines().find(absl::StrCat("job=j1 rank=1 worker pid ", w.pid(),
                                          " killed by signal 9 by the kernel's OOM killer "
                                          "(out of memory)")),
            std::string::npos)
      << log.Lines();
  EXPECT_NE(log.Lines().find(absl::StrCat("Killed process ", w.pid(), " (python3)")), std::string::npos)
      << "the kernel's line is not in the agent's log: " << log.Lines();
}

// Where the kernel log cannot be read (the shipped units' sandbox, most
// containers), the worker's memory cgroup says it: its OOM kill count rose
// since the agent saw the worker there. A SIGKILL from elsewhere, in a
// cgroup with no OOM kill, stays a plain signal 9.
TEST_F(AgentTest, AWorkerTheOomKillerKilledIsReportedSoByItsCgroupWithoutTheKernelLog) {
  const std::string cgroup = MakeMemoryCgroup(64 << 20);
  if (cgroup.empty()) GTEST_SKIP() << "needs root and a memory cgroup it can make";
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = Options();
  options.kernel_log = "";
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  LogCapture log;
  const std::string go = state_dir_ + "/go";
  // Into the cgroup, then wait until the agent has seen it there.
  auto worker = [&](const std::string& then) {
    return absl::StrCat("echo $$ > ", cgroup, "/cgroup.procs && while [ ! -e ", go,
                        " ]; do sleep 0.05; done; ", then);
  };
  // The agent's line saying it saw `job`'s worker in the cgroup.
  auto moved = [&](const std::string& job) {
    const std::regex line(absl::StrCat("job=", job, " rank=1 worker pid [0-9]+ is now in memory cgroup "));
    return RunUntil([&] { return std::regex_search(log.Lines(), line); });
  };
  Command({Start("j1", 1, worker("kill -9 $$"), 1)});
  ASSERT_TRUE(moved("j1")) << log.Lines();
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  EXPECT_EQ(Workers("j1")[0].exit().signal(), SIGKILL);
  EXPECT_FALSE(Workers("j1")[0].exit().oom_killed()) << "a kill -9 taken for the OOM killer's";
  ::unlink(go.c_str());

  Command({Start("j2", 1, worker("exec python3 -c 'x = bytearray(512 << 20); print(len(x))'"), 1)});
  ASSERT_TRUE(moved("j2")) << log.Lines();
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(RunUntil([&] { return AllIn("j2", v1::WORKER_STATE_EXITED, 1); }));
  const v1::WorkerStatus w = Workers("j2")[0];
  ::rmdir(cgroup.c_str());
  EXPECT_EQ(w.exit().signal(), SIGKILL);
  EXPECT_TRUE(w.exit().oom_killed()) << log.Lines();
  EXPECT_NE(log.Lines().find(absl::StrCat("job=j2 rank=1 the kernel log is not readable here "
                                          "(--kernel-log is empty); the worker's memory cgroup ")),
            std::string::npos)
      << log.Lines();
  EXPECT_NE(log.Lines().find(absl::StrCat("job=j2 rank=1 worker pid ", w.pid(),
                                          " killed by signal 9 by the kernel's OOM killer")),
            std::string::npos)
      << log.Lines();
}

// A worker's child in a session of its own (setsid) outlives the kill of
// the worker's process group. The agent, its subreaper, adopts it once its
// parent is gone, keeps it while its job's round still has a live worker
// here, and kills it once the round's workers have ended.
TEST_F(AgentTest, WhatAWorkerLeftRunningInASessionOfItsOwnIsKilledWithItsRound) {
  LogCapture log;
  const std::string pid_file = state_dir_ + "/helper.pid";
  // A subshell starts the helper and exits: the helper is orphaned at once
  // while the worker itself goes on.
  Command({Start("j1", 1,
                 absl::StrCat("(setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > ", pid_file,
                              ".tmp; mv ", pid_file, ".tmp ", pid_file, "); echo started; exec sleep 60"),
                 1)});
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 1).find("started") != std::string::npos; }));
  std::ifstream in(pid_file);
  pid_t helper = 0;
  in >> helper;
  ASSERT_GT(helper, 0);
  const auto alive = [](pid_t pid) {
    // A zombie counts as gone: it was killed and awaits its reaping.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    return close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z';
  };
  ASSERT_TRUE(alive(helper));
  const auto adopted = [&] {
    std::ifstream stat("/proc/" + std::to_string(helper) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    return close != std::string::npos &&
           std::atoi(line.c_str() + close + 4) == static_cast<int>(::getpid());
  };
  ASSERT_TRUE(RunUntil(adopted)) << "the agent's process did not adopt the helper";
  // Three housekeeping turns with the round's worker alive: the helper stays.
  const auto until = std::chrono::steady_clock::now() + 3 * kHousekeepingInterval + milliseconds(200);
  while (std::chrono::steady_clock::now() < until) {
    agent_->RunOnce();
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(alive(helper)) << "killed while its job's worker still ran";
  EXPECT_EQ(log.Lines().find("killed pid"), std::string::npos) << log.Lines();
  // The job is no longer this node's: its worker is stopped, then the helper goes.
  Command({});
  ASSERT_TRUE(RunUntil([&] { return !alive(helper); })) << "the helper outlived its round";
  EXPECT_NE(log.Lines().find(absl::StrCat("job=j1 rank=- killed pid ", helper,
                                          " (sleep and its process group), which round 1's "
                                          "workers left running after they ended")),
            std::string::npos)
      << log.Lines();
  ASSERT_TRUE(RunUntil([&] { return ::access(("/proc/" + std::to_string(helper)).c_str(), F_OK) != 0; }))
      << "the killed helper was not reaped";
}

// A helper round 1's worker left in a session of its own is killed before
// round 2's worker of the same rank starts, not at a later housekeeping: a
// rank's helper never runs beside the next round's worker.
TEST_F(AgentTest, AnEarlierRoundsHelperIsKilledBeforeTheNextRoundsWorkerStarts) {
  LogCapture log;
  const std::string pid_file = state_dir_ + "/helper.pid";
  Command({Start("j1", 1,
                 absl::StrCat("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > ", pid_file,
                              ".tmp; mv ", pid_file, ".tmp ", pid_file,
                              "; echo started; trap 'exit 0' TERM; while true; do sleep 0.05; done"),
                 1)});
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 1).find("started") != std::string::npos; }));
  pid_t helper = 0;
  std::ifstream(pid_file) >> helper;
  ASSERT_GT(helper, 0);
  Command({Start("j1", 2, "echo round $LOCKSTEP_ROUND; exec sleep 60", 1)});
  ASSERT_TRUE(RunUntil([&] {
    auto reports = agent_->ListWorkers("j1");
    return !reports.empty() && reports[0].round() == 2;
  }));
  const std::string lines = log.Lines();
  const size_t killed = lines.find(absl::StrCat("killed pid ", helper, " (sleep and its process group), which round 1's"));
  const size_t spawned = lines.find("spawned pid");
  const size_t spawned_round2 = lines.find("for round 2", spawned);
  ASSERT_NE(killed, std::string::npos) << lines;
  ASSERT_NE(spawned_round2, std::string::npos) << lines;
  EXPECT_LT(killed, spawned_round2) << "round 2's worker started beside round 1's helper:\n" << lines;
}

// A worker's output past max_log_bytes is moved to rank-R.stdout.1 and the
// file emptied; the worker writes on into it, after the rotation's line. A
// reader following from an offset past the new end starts again from 0.
TEST_F(AgentTest, LogsPastTheCapAreRotatedAndTheWorkerWritesOn) {
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = Options();
  options.base_env = {"PATH=/usr/bin:/bin"};
  options.max_log_bytes = 64 * 1024;
  // The copy is the cleaner's work, off the loop thread.
  std::mutex seen_mu;
  std::vector<std::string> seen;
  options.before_clean = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(seen_mu);
    seen.push_back(what);
  };
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  LogCapture log;
  const std::string printed = state_dir_ + "/printed", go = state_dir_ + "/go";
  Command({Start("j1", 1,
                 absl::StrCat("i=0; while [ $i -lt 2000 ]; do echo \"line $i of a hundred bytes: "
                              "padding padding padding padding padding padding padding\"; "
                              "i=$((i+1)); done; echo small >&2; touch ", printed, "; "
                              "while [ ! -e ", go, " ]; do sleep 0.05; done; echo after; exec sleep 60"),
                 1)});
  ASSERT_TRUE(RunUntil([&] { return Workers("j1").size() == 1; }));
  // The loop stands still (only RunOnce measures the logs) until the worker
  // has printed it all: the rotation cannot cut the output short.
  for (int i = 0; i < 300 && ::access(printed.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_EQ(::access(printed.c_str(), F_OK), 0) << "the worker did not print its lines in 15 s";
  const std::string path = state_dir_ + "/jobs/j1/rank-1.stdout";
  // Done once the cleaner logs it (.1 appears before the log is emptied).
  ASSERT_TRUE(RunUntil([&] { return log.Lines().find("bytes moved to rank-1.stdout.1") != std::string::npos; }))
      << "no rotation: " << Output("j1", 1).size() << " bytes in " << path;
  std::ifstream in(path + ".1");
  std::stringstream previous;
  previous << in.rdbuf();
  EXPECT_EQ(previous.str().rfind("=== lockstep: job j1 round 1 rank 1", 0), 0u) << previous.str().substr(0, 200);
  EXPECT_NE(previous.str().find("line 1999 of a hundred bytes"), std::string::npos);
  const std::string marker =
      "=== lockstep: rank-1.stdout grew past 65536 bytes (lockstepd --max-log-mb) and was rotated; "
      "the earlier output is in rank-1.stdout.1 ===\n";
  EXPECT_EQ(Output("j1", 1), marker);
  {
    std::lock_guard<std::mutex> lock(seen_mu);
    EXPECT_EQ(seen, std::vector<std::string>{path}) << "not rotated (once) by the cleaner";
  }
  // A follower whose offset is past the new end reads it again from 0.
  auto chunk = agent_->ReadLogs("j1", 1, false, static_cast<int64_t>(previous.str().size()), 0, 0);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->data, marker);
  std::ofstream(go) << "";
  ASSERT_TRUE(RunUntil([&] { return Output("j1", 1) == marker + "after\n"; })) << Output("j1", 1);
  auto err = agent_->ReadLogs("j1", 1, true, 0, 0, 0);
  ASSERT_TRUE(err.ok());
  EXPECT_NE(err->data.find("small\n"), std::string::npos) << "stderr, below the cap, kept: " << err->data;
  EXPECT_NE(::access((state_dir_ + "/jobs/j1/rank-1.stderr.1").c_str(), F_OK), 0);
  // Logged by the cleaner once the rotation is done.
  const std::string rotated = absl::StrCat("job=j1 rank=1 rank-1.stdout grew past 65536 bytes: its ",
                                           previous.str().size(), " bytes moved to rank-1.stdout.1");
  EXPECT_TRUE(RunUntil([&] { return log.Lines().find(rotated) != std::string::npos; })) << log.Lines();
}

// A follower whose file is rotated between two of its reads, and refilled
// past its offset, reads on in .1 from where it was, then the new file
// from its start: nothing skipped, nothing twice (before generations it
// read on at its offset in the new file, skipping .1's rest and the
// rotation's line). Rotated twice: the new file from its start, said.
TEST_F(AgentTest, AFollowerReadsOnAcrossARotationAndIsToldWhenOneWasMissed) {
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = Options();
  options.base_env = {"PATH=/usr/bin:/bin"};
  options.max_log_bytes = 64 * 1024;
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  LogCapture log;
  const std::string dir = state_dir_ + "/";
  // Two bursts of 2000 lines (about 200 KB each), each followed by a file
  // the test waits for, and a file the worker waits for.
  auto burst = [&](const std::string& tag, const std::string& printed, const std::string& go) {
    return absl::StrCat("i=0; while [ $i -lt 2000 ]; do echo \"", tag,
                        " line $i of a hundred bytes: padding padding padding padding padding "
                        "padding\"; i=$((i+1)); done; touch ", dir, printed, "; while [ ! -e ", dir,
                        go, " ]; do sleep 0.05; done; ");
  };
  Command({Start("j1", 1, burst("first", "printed1", "go1") + burst("second", "printed2", "go2") + "exec sleep 60", 1)});
  ASSERT_TRUE(RunUntil([&] { return Workers("j1").size() == 1; }));
  // The loop stands still between RunUntil calls: only they rotate.
  auto wait_file = [&](const std::string& name) {
    for (int i = 0; i < 300 && ::access((dir + name).c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    return ::access((dir + name).c_str(), F_OK) == 0;
  };
  auto rotations = [&] {
    const std::string lines = log.Lines();
    int n = 0;
    for (size_t at = lines.find("bytes moved to rank-1.stdout.1"); at != std::string::npos;
         at = lines.find("bytes moved to rank-1.stdout.1", at + 1)) {
      ++n;
    }
    return n;
  };
  const std::string path = state_dir_ + "/jobs/j1/rank-1.stdout";
  auto file = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  };
  // Reads from (offset, generation) until a chunk is empty.
  struct Read {
    std::string data;
    int64_t offset = 0;
    std::string generation;
    bool rotated_past = false;
  };
  auto read_all = [&](int64_t offset, const std::string& generation) {
    Read r{"", offset, generation, false};
    for (int i = 0; i < 100; ++i) {
      auto chunk = agent_->ReadLogs("j1", 1, false, r.offset, 0, 16 * 1024, r.generation);
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok()) break;
      r.rotated_past = r.rotated_past || chunk->rotated_past;
      r.offset = chunk->next_offset;
      r.generation = chunk->generation;
      if (chunk->data.empty()) break;
      r.data += chunk->data;
    }
    return r;
  };

  ASSERT_TRUE(wait_file("printed1"));
  // A follower 4 KB into the first burst.
  auto first = agent_->ReadLogs("j1", 1, false, 0, 0, 4096, "");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->data.size(), 4096u);
  const std::string burst1 = file(path);
  ASSERT_TRUE(RunUntil([&] { return rotations() == 1; })) << "no rotation: " << log.Lines();
  EXPECT_EQ(file(path + ".1"), burst1);
  std::ofstream(dir + "go1") << "";
  ASSERT_TRUE(wait_file("printed2"));
  const std::string refilled = file(path);  // the rotation's line, then the second burst
  ASSERT_GT(refilled.size(), 4096u * 2) << "the second burst should refill past the follower";
  ASSERT_EQ(refilled.rfind("=== lockstep: rank-1.stdout grew past 65536 bytes", 0), 0u) << refilled.substr(0, 200);
  // A second follower, 4 KB into the refilled file.
  const Read second = read_all(0, "");
  ASSERT_EQ(second.data, refilled);
  Read second_at_4k{"", 4096, second.generation, false};

  const Read across = read_all(first->next_offset, first->generation);
  EXPECT_FALSE(across.rotated_past);
  EXPECT_TRUE(across.data == burst1.substr(4096) + refilled)
      << "read " << across.data.size() << " bytes, want " << burst1.size() - 4096 << " of .1 then "
      << refilled.size() << "; starts: " << across.data.substr(0, 120);
  EXPECT_EQ(across.generation, second.generation);

  ASSERT_TRUE(RunUntil([&] { return rotations() == 2; })) << "no second rotation: " << log.Lines();
  const std::string after_two = file(path);
  // One rotation behind: on from 4 KB in .1 (the refilled file), then the new file.
  const Read one_behind = read_all(second_at_4k.offset, second_at_4k.generation);
  EXPECT_FALSE(one_behind.rotated_past);
  EXPECT_TRUE(one_behind.data == refilled.substr(4096) + after_two) << one_behind.data.substr(0, 120);
  // Two behind: the first burst's follower starts the new file over, told so.
  const Read two_behind = read_all(first->next_offset, first->generation);
  EXPECT_TRUE(two_behind.rotated_past);
  EXPECT_EQ(two_behind.data, after_two);
  // Another agent process's generation is as good as none: told, from 0.
  const Read stranger = read_all(10, "logs-someone-else.0");
  EXPECT_TRUE(stranger.rotated_past);
  EXPECT_EQ(stranger.data, after_two);
  std::ofstream(dir + "go2") << "";
}

// A coordinator that renews the lease but cannot apply the reports (its job
// store full) says so in reports_not_applied. The agent keeps its workers
// past many leases, says so once (rate-limited), and reports a finished run
// until a heartbeat carrying it is applied: only then does it forget it.
TEST_F(AgentTest, ReportsNotAppliedKeepTheLeaseAndAreSentAgain) {
  UseFakeClock();
  coord_.SetLease(1.0);
  LogCapture log;
  v1::HeartbeatResponse resp;
  *resp.add_commands() = Start("long", 1, "echo up; exec sleep 60", 1);
  *resp.add_commands() = Start("short", 1, "exit 0", 1);
  resp.set_reports_not_applied("job store full");
  coord_.SetResponse(resp);
  ASSERT_TRUE(RunUntil([&] {
    return Output("long", 1).find("up") != std::string::npos &&
           AllIn("short", v1::WORKER_STATE_EXITED, 1);
  })) << "workers did not start, or the short one did not end";
  resp.mutable_commands()->DeleteSubrange(1, 1);  // as if "short" were done
  coord_.SetResponse(resp);
  const auto reports_short = [](const v1::HeartbeatRequest& hb) {
    for (const auto& r : hb.jobs()) {
      if (r.job_id() == "short") return true;
    }
    return false;
  };
  for (int i = 0; i < 50; ++i) {  // 5 s: five leases
    fake_clock_.Advance(milliseconds(100));
    agent_->RunOnce();
  }
  EXPECT_TRUE(AllIn("long", v1::WORKER_STATE_RUNNING, 1) || AllIn("long", v1::WORKER_STATE_STARTING, 1))
      << "the long job's worker was stopped though every heartbeat renewed the lease";
  ASSERT_FALSE(coord_.heartbeats().empty());
  EXPECT_TRUE(reports_short(coord_.heartbeats().back()))
      << "a finished run whose report was not applied is no longer reported";
  const std::string lines = log.Lines();
  const std::string warning =
      "the coordinator renewed this node's lease but could not apply its job reports; they go "
      "again with every heartbeat: job store full";
  EXPECT_NE(lines.find(warning), std::string::npos) << lines;
  EXPECT_EQ(lines.find(warning, lines.find(warning) + 1), std::string::npos) << "said twice in 5 s";
  EXPECT_EQ(lines.find("stopped this node's workers"), std::string::npos) << lines;

  // Applied: "short" goes with the heartbeat after the one that carried it.
  resp.clear_reports_not_applied();
  coord_.SetResponse(resp);
  for (int i = 0; i < 3; ++i) {
    fake_clock_.Advance(milliseconds(100));
    agent_->RunOnce();
  }
  EXPECT_FALSE(reports_short(coord_.heartbeats().back())) << "still reported once applied";
}

// While the coordinator is down every loop turn retries, and each failure
// would warn: at most one "cannot register" line per 5 s and one "heartbeat
// failed" line per 2 s, counted per agent. The test runs twice, each time
// on its own agent: with one limiter for the whole process the second run
// would log nothing.
class UnreachableCoordinatorTest : public AgentTest, public ::testing::WithParamInterface<int> {};

TEST_P(UnreachableCoordinatorTest, RepeatedFailuresAreLoggedOncePerAgent) {
  UseFakeClock();
  const auto count = [](const std::string& lines, const std::string& what) {
    int n = 0;
    for (size_t at = lines.find(what); at != std::string::npos; at = lines.find(what, at + 1)) ++n;
    return n;
  };
  {
    LogCapture log;
    coord_.SetFailure(absl::UnavailableError("coordinator down"));
    for (int i = 0; i < 20; ++i) {
      fake_clock_.Advance(seconds(1));
      agent_->RunOnce();
    }
    EXPECT_FALSE(agent_->registered());
    EXPECT_EQ(count(log.Lines(), "cannot register with the coordinator: UNAVAILABLE: coordinator down"), 1)
        << log.Lines();
  }
  coord_.SetFailure(absl::OkStatus());
  fake_clock_.Advance(seconds(1));
  agent_->RunOnce();
  ASSERT_TRUE(agent_->registered());
  {
    LogCapture log;
    coord_.SetFailure(absl::UnavailableError("coordinator down"));
    for (int i = 0; i < 20; ++i) {
      fake_clock_.Advance(seconds(1));
      agent_->RunOnce();
    }
    EXPECT_EQ(count(log.Lines(), "heartbeat failed"), 1) << log.Lines();
  }
}

INSTANTIATE_TEST_SUITE_P(EachOnItsOwnAgent, UnreachableCoordinatorTest, ::testing::Values(1, 2));


// A 0755 dir in /tmp for agents running jobs as uids of their own: workers
// must reach their job dirs and the leftover dir (Bazel's TEST_TMPDIR lies
// under /root, 0700). Removed with what it holds when it goes.
struct JobUidDirs {
  std::string base, left;
  // False (with a test failure) if it could not be made or a uid of
  // [first, last] has processes on this machine.
  bool Make(uint32_t first, uint32_t last) {
    char made[] = "/tmp/lockstep-agent-uids.XXXXXX";
    if (::mkdtemp(made) == nullptr) return false;
    base = made;
    left = base + "/tmp";
    EXPECT_EQ(::chmod(base.c_str(), 0755), 0);
    EXPECT_EQ(::mkdir(left.c_str(), 01777), 0);
    EXPECT_EQ(::chmod(left.c_str(), 01777), 0);
    for (uint32_t u = first; u <= last; ++u) {
      if (!ProcessesOfUid(u).empty()) {
        ADD_FAILURE() << "uid " << u << " is in use on this machine";
        return false;
      }
    }
    return !::testing::Test::HasFailure();
  }
  // `options` with its state dir, uid range, lease dir and leftover dir here.
  AgentOptions Options(AgentOptions options, uint32_t first, uint32_t last) const {
    options.base_env = {"PATH=/usr/bin:/bin"};
    options.state_dir = base + "/state";
    options.job_uid_first = first;
    options.job_uid_last = last;
    options.uid_lease_dir = base + "/leases";
    options.uid_leftover_dirs = {left};
    return options;
  }
  ~JobUidDirs() {
    if (!base.empty()) std::filesystem::remove_all(base);
  }
};

// A daemon killed before it returned its jobs' uids leaves their job dirs
// theirs: when the agent starts again on that state dir, each such uid
// that no one holds is cleaned (dirs to root, its files removed); one held
// elsewhere is left, and said so.
TEST_F(AgentTest, UidsAKilledAgentLeftAreCleanedWhenItStartsAgain) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to job uids";
  constexpr uint32_t kUid = 70985;  // 70985-70986, no other test's
  JobUidDirs dirs;
  ASSERT_TRUE(dirs.Make(kUid, kUid + 1));
  AgentOptions options = dirs.Options(Options(), kUid, kUid + 1);
  const std::string jobs = options.state_dir + "/jobs";
  std::filesystem::create_directories(jobs);
  for (uint32_t uid : {kUid, kUid + 1}) {
    const std::string job = absl::StrCat(jobs, "/old-", uid);
    ASSERT_EQ(::mkdir(job.c_str(), 0750), 0);
    std::ofstream(job + "/rank-0.stdout") << "the old job's output\n";
    const std::string file = absl::StrCat(dirs.left, "/left-", uid);
    std::ofstream(file) << "the old job's data\n";
    for (const std::string& path : {job, job + "/rank-0.stdout", file}) {
      ASSERT_EQ(::chown(path.c_str(), uid, uid), 0) << path;
    }
  }
  // Another daemon on the host holds the second uid now.
  auto held = UidLeases(options.uid_lease_dir, kUid, kUid + 1).Take(kUid + 1);
  ASSERT_TRUE(held.ok()) << held.status();
  LogCapture log;
  agent_->Shutdown(milliseconds(200));
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  auto owner = [](const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_uid) : -1;
  };
  const std::string first = absl::StrCat(jobs, "/old-", kUid);
  // Its last line is logged once the clean is done.
  const std::string cleaned = absl::StrCat("uid ", kUid, " cleaned of an earlier job's leftovers (1 job dir(s) "
                                           "given back to root) and free again");
  ASSERT_TRUE(RunUntil([&] { return log.Lines().find(cleaned) != std::string::npos; })) << log.Lines();
  EXPECT_EQ(owner(first), 0);
  EXPECT_EQ(owner(first + "/rank-0.stdout"), 0);
  EXPECT_EQ(owner(absl::StrCat(dirs.left, "/left-", kUid)), -1);
  EXPECT_NE(log.Lines().find(absl::StrCat("job dirs under ", jobs, " are still uid ", kUid,
                                          "'s (this daemon stopped before returning it): cleaning it")),
            std::string::npos)
      << log.Lines();
  // The held uid: untouched, and said so.
  EXPECT_EQ(owner(absl::StrCat(jobs, "/old-", kUid + 1)), kUid + 1);
  EXPECT_EQ(owner(absl::StrCat(dirs.left, "/left-", kUid + 1)), kUid + 1);
  EXPECT_NE(log.Lines().find(absl::StrCat("a job dir under ", jobs, " is still uid ", kUid + 1,
                                          "'s, which cannot be cleaned now")),
            std::string::npos)
      << log.Lines();
}

// With a uid per job, the node caps each job's processes and threads
// (RLIMIT_NPROC, lockstepd --max-processes): a job that sets none gets the
// cap, one may ask for fewer, and one that asks for more is refused at
// launch, naming both numbers.
TEST_F(AgentTest, AJobUidsProcessesAreCappedByTheNode) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run workers as job uids";
  constexpr uint32_t kUid = 70987;  // 70987-70989, no other test's
  JobUidDirs dirs;
  ASSERT_TRUE(dirs.Make(kUid, kUid + 2));
  AgentOptions options = dirs.Options(Options(), kUid, kUid + 2);
  options.max_job_processes = 300;
  agent_->Shutdown(milliseconds(200));
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  auto with_limit = [](v1::AgentCommand cmd, int64_t limit) {
    cmd.mutable_spec()->mutable_limits()->set_max_processes(limit);
    return cmd;
  };
  const std::string nproc = "awk '/^Max processes/ { print \"nproc=\" $3 }' /proc/self/limits";
  Command({Start("j1", 1, nproc, 1), with_limit(Start("j2", 1, nproc, 1), 100),
           with_limit(Start("j3", 1, "echo ran", 1), 301)});
  ASSERT_TRUE(RunUntil([&] {
    return AllIn("j1", v1::WORKER_STATE_EXITED, 1) && AllIn("j2", v1::WORKER_STATE_EXITED, 1) &&
           AllIn("j3", v1::WORKER_STATE_EXITED, 1);
  }));
  EXPECT_NE(Output("j1", 1).find("nproc=300\n"), std::string::npos) << Output("j1", 1);
  EXPECT_NE(Output("j2", 1).find("nproc=100\n"), std::string::npos) << Output("j2", 1);
  const v1::WorkerStatus refused = Workers("j3")[0];
  EXPECT_TRUE(refused.exit().launch_error());
  EXPECT_EQ(refused.exit().message(),
            "spec.limits.max_processes 301 is above this node's 300 processes and threads per job "
            "(lockstepd --max-processes)");
  EXPECT_EQ(Output("j3", 1).find("ran"), std::string::npos);
}

// A job's uid (--job-uids) is returned off the agent's loop thread: while
// the cleaner cleans it (held here by a hook, as a huge tree in /tmp
// would hold it) the agent goes on heartbeating and starting jobs; the uid
// is handed to no job until it is clean, and the job that had it starts
// here again only after (its dir changes owner meanwhile). A uid an earlier
// daemon left unclean is cleaned before anyone gets it.
TEST_F(AgentTest, AJobsUidIsCleanedOffTheLoopThreadAndHandedOutOnlyOnceClean) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run workers as job uids";
  constexpr uint32_t kUid = 70980;  // 70980-70982, no other test's
  JobUidDirs dirs;
  ASSERT_TRUE(dirs.Make(kUid, kUid + 2));
  const std::string& left = dirs.left;
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  bool holding = true;
  std::vector<std::string> cleaned;  // what the hook saw, in order
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = dirs.Options(Options(), kUid, kUid + 2);
  options.heartbeat_interval = milliseconds(50);
  options.before_clean = [&](const std::string& what) {
    if (what.rfind("uid ", 0) != 0) return;  // uids being found go on
    std::unique_lock<std::mutex> lock(hold_mu);
    cleaned.push_back(what);
    hold_cv.notify_all();
    hold_cv.wait(lock, [&] { return !holding; });
  };
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  LogCapture log;
  auto hook_saw = [&](size_t n) {
    std::lock_guard<std::mutex> lock(hold_mu);
    return cleaned.size() >= n;
  };
  auto exists = [](const std::string& path) { return ::access(path.c_str(), F_OK) == 0; };
  auto uid_of = [&](const std::string& job) {
    const std::string out = Output(job, 1);
    const size_t at = out.find("uid=");
    return at == std::string::npos ? -1 : std::atoi(out.c_str() + at + 4);
  };

  // j1 runs as the first uid and leaves a file in the shared dir.
  Command({Start("j1", 1, absl::StrCat("echo left > ", left, "/j1-file; echo uid=$(id -u)"), 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }));
  EXPECT_EQ(uid_of("j1"), static_cast<int>(kUid)) << Output("j1", 1);
  ASSERT_TRUE(exists(left + "/j1-file"));
  // The coordinator forgets j1 here: its uid goes to the cleaner, which
  // the hook holds.
  Command({});
  ASSERT_TRUE(RunUntil([&] { return hook_saw(1); })) << "the uid was never handed to the cleaner";
  EXPECT_EQ(cleaned[0], absl::StrCat("uid ", kUid));
  // The loop goes on meanwhile: heartbeats, and starts. j1 is assigned here
  // again and j2 arrives: j2 gets the next uid (the first is not clean yet),
  // and j1 waits until its uid is clean.
  const size_t beats = coord_.heartbeats().size();
  Command({Start("j1", 2, "echo uid=$(id -u) dir=$(stat -c %u .)", 1),
           Start("j2", 1, "echo uid=$(id -u); exec sleep 60", 1)});
  ASSERT_TRUE(RunUntil([&] { return uid_of("j2") > 0; })) << Output("j2", 1);
  EXPECT_EQ(uid_of("j2"), static_cast<int>(kUid + 1)) << "given a uid still being cleaned";
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= beats + 10; }))
      << "the agent stopped heartbeating while a uid was cleaned";
  EXPECT_TRUE(Workers("j1").empty()) << "j1 started again while its dir was being given to root";
  EXPECT_TRUE(exists(left + "/j1-file"));
  // Cleaned: the file goes, then j1 starts, as the first uid again, in its
  // own dir.
  {
    std::lock_guard<std::mutex> lock(hold_mu);
    holding = false;
  }
  hold_cv.notify_all();
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); }))
      << "j1 did not start again once its uid was clean: " << log.Lines();
  EXPECT_FALSE(exists(left + "/j1-file"));
  EXPECT_NE(Output("j1", 1).find(absl::StrCat("uid=", kUid, " dir=", kUid)), std::string::npos)
      << Output("j1", 1);
  EXPECT_NE(log.Lines().find(absl::StrCat("job=j1 rank=- removed what uid ", kUid, " left: 1 entries under ",
                                          left, " and 0 System V IPC objects")),
            std::string::npos)
      << log.Lines();
  EXPECT_NE(log.Lines().find(absl::StrCat("job=j1 rank=- uid ", kUid, " returned; ")), std::string::npos)
      << log.Lines();

  // A file of the third uid's, as a daemon that stopped before cleaning it
  // leaves it: j3 is not given that uid as it is. The first and second are
  // held, so no clean uid is free: the third is cleaned, then j3 gets it.
  const std::string stale = left + "/stale";
  std::ofstream(stale) << "an earlier job's\n";
  ASSERT_EQ(::chown(stale.c_str(), kUid + 2, kUid + 2), 0);
  Command({Start("j1", 2, "true", 1), Start("j2", 1, "exec sleep 60", 1),
           Start("j3", 1, absl::StrCat("cat ", stale, " 2>&1; echo uid=$(id -u)"), 1)});
  ASSERT_TRUE(RunUntil([&] { return AllIn("j3", v1::WORKER_STATE_EXITED, 1); })) << log.Lines();
  EXPECT_EQ(uid_of("j3"), static_cast<int>(kUid + 2)) << Output("j3", 1);
  EXPECT_EQ(Output("j3", 1).find("an earlier job's"), std::string::npos) << "j3 read it: " << Output("j3", 1);
  EXPECT_FALSE(exists(stale));
  for (const std::string& line :
       {absl::StrCat("uid ", kUid + 2, " still owns what an earlier job left"),
        absl::StrCat("job=j3 rank=- no clean uid free: waiting for uid(s) ", kUid + 2, " to be cleaned"),
        absl::StrCat("uid ", kUid + 2, " cleaned of an earlier job's leftovers")}) {
    EXPECT_NE(log.Lines().find(line), std::string::npos) << line << " is not in " << log.Lines();
  }
  // The agent stops: every uid goes back clean before Shutdown returns.
  agent_->Shutdown(milliseconds(200));
  for (uint32_t u = kUid; u <= kUid + 2; ++u) {
    auto lease = UidLeases(options.uid_lease_dir, u, u).Acquire();
    EXPECT_TRUE(lease.ok()) << "uid " << u << " still leased after the agent stopped: " << lease.status();
  }
}

// Finding a job a uid (listing /proc and the shared dirs for what an
// earlier job left) is the cleaner's too: while it takes, the agent goes on
// heartbeating, and the job starts once its uid is found.
TEST_F(AgentTest, AJobsUidIsFoundOffTheLoopThread) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run workers as job uids";
  constexpr uint32_t kUid = 70983;  // 70983-70984, no other test's
  JobUidDirs dirs;
  ASSERT_TRUE(dirs.Make(kUid, kUid + 1));
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  std::string hold;  // the work held, while set
  std::vector<std::string> seen;
  agent_->Shutdown(milliseconds(200));
  AgentOptions options = dirs.Options(Options(), kUid, kUid + 1);
  options.heartbeat_interval = milliseconds(50);
  options.before_clean = [&](const std::string& what) {
    std::unique_lock<std::mutex> lock(hold_mu);
    seen.push_back(what);
    hold_cv.notify_all();
    hold_cv.wait(lock, [&] { return hold != what; });
  };
  auto held = [&](const std::string& what) {
    return RunUntil([&] {
      std::lock_guard<std::mutex> lock(hold_mu);
      return std::find(seen.begin(), seen.end(), what) != seen.end();
    });
  };
  auto let_go = [&] {
    {
      std::lock_guard<std::mutex> lock(hold_mu);
      hold.clear();
    }
    hold_cv.notify_all();
  };
  hold = "a uid for job j1";
  agent_ = std::make_unique<Agent>(options, RealClock(), launcher_.get(), &coord_);
  LogCapture log;
  Command({Start("j1", 1, "echo uid=$(id -u)", 1)});
  ASSERT_TRUE(held("a uid for job j1")) << "no uid was looked for: " << log.Lines();
  const size_t beats = coord_.heartbeats().size();
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= beats + 10; }))
      << "the agent stopped heartbeating while a uid was being found";
  EXPECT_TRUE(Workers("j1").empty()) << "started before its uid was found";
  let_go();
  ASSERT_TRUE(RunUntil([&] { return AllIn("j1", v1::WORKER_STATE_EXITED, 1); })) << log.Lines();
  EXPECT_NE(Output("j1", 1).find(absl::StrCat("uid=", kUid)), std::string::npos) << Output("j1", 1);

  // A start the coordinator withdraws while its uid is being found: the
  // uid found is given back, and the job never starts.
  {
    std::lock_guard<std::mutex> lock(hold_mu);
    hold = "a uid for job j2";
  }
  Command({Start("j1", 1, "true", 1), Start("j2", 1, "echo started", 1)});
  ASSERT_TRUE(held("a uid for job j2")) << log.Lines();
  Command({Start("j1", 1, "true", 1)});
  const size_t now = coord_.heartbeats().size();
  ASSERT_TRUE(RunUntil([&] { return coord_.heartbeats().size() >= now + 3; }));
  let_go();
  ASSERT_TRUE(RunUntil([&] {
    return log.Lines().find(absl::StrCat("job=j2 rank=- uid ", kUid + 1,
                                         ", found for a start no longer wanted here, is free again")) !=
           std::string::npos;
  })) << log.Lines();
  EXPECT_TRUE(UidLeases(options.uid_lease_dir, kUid + 1, kUid + 1).Acquire().ok())
      << "the uid found for the withdrawn start stayed leased";
  EXPECT_TRUE(Workers("j2").empty());
  agent_->Shutdown(milliseconds(200));
  for (uint32_t u = kUid; u <= kUid + 1; ++u) {
    auto lease = UidLeases(options.uid_lease_dir, u, u).Acquire();
    EXPECT_TRUE(lease.ok()) << "uid " << u << " still leased after the agent stopped: " << lease.status();
  }
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
