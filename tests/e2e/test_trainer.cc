// A stand-in training program for the end-to-end tests: reads the worker
// environment exactly as a real trainer does, meets its peers through the
// coordinator's store (LOCKSTEP_STORE, namespace "<job>/<round>"), claims
// its rank there (a second owner of a rank in one round exits 70), reports
// progress to its agent, prints one line per step, and fails on request.
//
// Environment knobs (all optional):
//   TRAINER_STEPS=20  TRAINER_STEP_MS=100     length of the run
//   TRAINER_UNTIL_FILE=f                      ends the run (as if its last step) at the
//                                             first step at which f exists: a job that
//                                             runs until the test is done with it
//   TRAINER_STEPS_LATER=n                     steps in rounds after the first (fault
//                                             tests: a long first round, short retries)
//   TRAINER_FAIL_RANK=r TRAINER_FAIL_CODE=c   rank r exits with code c ...
//   TRAINER_FAIL_AFTER=s                      ... after s steps (0: before the first report)
//   TRAINER_FAIL_UNTIL_RESTART=n              ... only while LOCKSTEP_RESTART_COUNT < n
//   TRAINER_OUT_DIR=d                         write d/pid-rank-R (pid), d/done-round-N-rank-R
//   TRAINER_STORE_BYTES=n                     also store n bytes under payload/rank-R (memory
//                                             benches: what a round leaves in the store)
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "client/progress_reporter.h"
#include "rendezvous/store.h"
#include "rendezvous/store_client.h"

namespace {

std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int EnvInt(const char* name, int fallback) {
  std::string v = Env(name);
  return v.empty() ? fallback : std::atoi(v.c_str());
}

int Die(int code, const std::string& msg) {
  std::fprintf(stderr, "test_trainer: %s\n", msg.c_str());
  return code;
}

}  // namespace

int main() {
  using namespace lockstep;
  const char* required[] = {"LOCKSTEP_JOB_ID", "LOCKSTEP_RANK", "LOCKSTEP_LOCAL_RANK",
                            "LOCKSTEP_WORLD_SIZE", "LOCKSTEP_LOCAL_WORLD_SIZE",
                            "LOCKSTEP_NODE_RANK", "LOCKSTEP_NUM_NODES", "LOCKSTEP_ROUND",
                            "LOCKSTEP_RESTART_COUNT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                            "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                            "TORCHELASTIC_RESTART_COUNT"};
  for (const char* name : required) {
    if (Env(name).empty()) return Die(64, std::string("missing ") + name);
  }
  if (Env("RANK") != Env("LOCKSTEP_RANK") || Env("WORLD_SIZE") != Env("LOCKSTEP_WORLD_SIZE") ||
      Env("GROUP_RANK") != Env("LOCKSTEP_NODE_RANK")) {
    return Die(64, "torchrun names disagree with LOCKSTEP_* names");
  }
  const std::string job = Env("LOCKSTEP_JOB_ID");
  const int rank = EnvInt("LOCKSTEP_RANK", -1);
  const int world = EnvInt("LOCKSTEP_WORLD_SIZE", 0);
  const int round = EnvInt("LOCKSTEP_ROUND", 0);
  const int restart = EnvInt("LOCKSTEP_RESTART_COUNT", 0);
  std::printf("test_trainer: job %s rank %d of %d (local %s of %s, node %s of %s) round %d "
              "restart %d master %s:%s pid %d\n",
              job.c_str(), rank, world, Env("LOCAL_RANK").c_str(), Env("LOCAL_WORLD_SIZE").c_str(),
              Env("GROUP_RANK").c_str(), Env("LOCKSTEP_NUM_NODES").c_str(), round, restart,
              Env("MASTER_ADDR").c_str(), Env("MASTER_PORT").c_str(), static_cast<int>(getpid()));
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    std::printf("test_trainer: rank %d max open files %llu\n", rank,
                static_cast<unsigned long long>(nofile.rlim_cur));
  }
  std::fflush(stdout);
  std::string out_dir = Env("TRAINER_OUT_DIR");
  if (!out_dir.empty()) {
    std::ofstream(out_dir + "/pid-rank-" + std::to_string(rank)) << getpid() << "\n";
  }

  // Meet the peers through the coordinator's store and claim the rank.
  std::string store_address = Env("LOCKSTEP_STORE");
  if (!store_address.empty()) {
    rendezvous::StoreClientOptions store_options;
    store_options.connect_timeout = std::chrono::seconds(10);
    store_options.token = Env("LOCKSTEP_STORE_TOKEN");
    auto store = rendezvous::ConnectStore(store_address, rendezvous::StoreNamespace(job, round),
                                          store_options);
    if (!store.ok()) return Die(65, "store: " + store.status().ToString());
    std::string me = std::to_string(getpid());
    auto owner = (*store)->CompareSet("owner/rank-" + std::to_string(rank), "", me);
    if (!owner.ok()) return Die(65, "store: " + owner.status().ToString());
    if (*owner != me) {
      return Die(70, "DUPLICATE: rank " + std::to_string(rank) + " already owned by pid " +
                         *owner + " in round " + std::to_string(round));
    }
    const int payload_bytes = EnvInt("TRAINER_STORE_BYTES", 0);
    if (payload_bytes > 0) {
      Status s = (*store)->Set("payload/rank-" + std::to_string(rank),
                               std::string(payload_bytes, 'x'));
      if (!s.ok()) return Die(65, "store: " + s.ToString());
    }
    auto arrived = (*store)->Add("arrived", 1);
    if (!arrived.ok()) return Die(65, "store: " + arrived.status().ToString());
    if (*arrived == world) (void)(*store)->Set("all-arrived", "1");
    Status s = (*store)->Wait({"all-arrived"}, std::chrono::seconds(60));
    if (!s.ok()) return Die(65, "store barrier: " + s.ToString());
    std::printf("test_trainer: rank %d met %d peers through the store\n", rank, world);
  }

  auto reporter = client::ProgressReporter::FromEnv();
  const int first_steps = EnvInt("TRAINER_STEPS", 20);
  const int steps = round > 1 ? EnvInt("TRAINER_STEPS_LATER", first_steps) : first_steps;
  const int step_ms = EnvInt("TRAINER_STEP_MS", 100);
  const int fail_rank = EnvInt("TRAINER_FAIL_RANK", -1);
  const int fail_code = EnvInt("TRAINER_FAIL_CODE", 1);
  const int fail_after = EnvInt("TRAINER_FAIL_AFTER", 0);
  const int fail_until = EnvInt("TRAINER_FAIL_UNTIL_RESTART", 1 << 30);
  const bool failing = rank == fail_rank && restart < fail_until;
  const std::string until_file = Env("TRAINER_UNTIL_FILE");
  for (int step = 1; step <= steps; ++step) {
    if (!until_file.empty() && access(until_file.c_str(), F_OK) == 0) {
      std::printf("test_trainer: rank %d found %s at step %d\n", rank, until_file.c_str(), step);
      break;
    }
    if (failing && step > fail_after) {
      std::fprintf(stderr, "test_trainer: rank %d failing on purpose with code %d at step %d\n",
                   rank, fail_code, step);
      return fail_code;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    double loss = 1.0 / step;
    std::printf("rank %d step %d loss %.4f\n", rank, step, loss);
    std::fflush(stdout);
    client::Progress p;
    p.step = step;
    p.samples_per_s = 32.0 * 1000 / step_ms;
    p.loss = loss;
    reporter->Report(p);
  }
  reporter->Flush(std::chrono::seconds(1));
  if (!out_dir.empty()) {
    std::ofstream(out_dir + "/done-round-" + std::to_string(round) + "-rank-" +
                  std::to_string(rank))
        << getpid() << "\n";
  }
  std::printf("test_trainer: rank %d done\n", rank);
  return 0;
}
