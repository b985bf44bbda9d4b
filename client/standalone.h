// One-host mode for users with no cluster (`lockstep run`, `lockstep submit
// --standalone`), torchrun --standalone's role: the CLI starts a private
// lockstepd (coordinator + agent on 127.0.0.1, port picked by the kernel)
// in a state dir of its own, runs one job there, follows the workers'
// output from the job dir, and stops the daemon when the job ends.
//
//   StandaloneDaemon::Options o;
//   ASSIGN_OR_RETURN(o.lockstepd, FindLockstepd(""));
//   ASSIGN_OR_RETURN(std::unique_ptr<StandaloneDaemon> d, StandaloneDaemon::Start(o));
//   ... talk to d->address() with the token in d->token_file() ...
//   d->Stop();   // SIGTERM: the daemon stops its workers, then exits
//
// Thread safety: not thread-safe; one thread (the CLI's main) uses it.
#ifndef LOCKSTEP_CLIENT_STANDALONE_H_
#define LOCKSTEP_CLIENT_STANDALONE_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace client {

// The lockstepd a standalone run starts: `flag` when given, else
// $LOCKSTEPD, else `lockstepd` beside this program (an installed CLI),
// else ../daemon/lockstepd from it (the Bazel tree), else the first
// lockstepd on PATH. NotFound names every place tried.
StatusOr<std::string> FindLockstepd(const std::string& flag);

class StandaloneDaemon {
 public:
  struct Options {
    std::string lockstepd;  // absolute path (FindLockstepd)
    // Kept after the run (the job's logs live in it); made 0700 under
    // $TMPDIR (lockstep-run-XXXXXX) when empty.
    std::string state_dir;
    std::vector<std::string> extra_args;  // more lockstepd flags
    std::chrono::milliseconds start_timeout{30000};
  };

  // Starts the daemon in its own process group (a Ctrl-C at the terminal
  // reaches the CLI only, which cancels the job first) with
  // PR_SET_PDEATHSIG, so a CLI killed outright still takes its daemon, and
  // the daemon its workers, down. Returns once the daemon serves (its
  // address file is written). Errors name the daemon's log and quote its
  // last lines: the daemon exited, or did not serve within the timeout.
  static StatusOr<std::unique_ptr<StandaloneDaemon>> Start(Options options);

  ~StandaloneDaemon();  // Stop() if still running
  StandaloneDaemon(const StandaloneDaemon&) = delete;
  StandaloneDaemon& operator=(const StandaloneDaemon&) = delete;

  const std::string& address() const { return address_; }
  const std::string& state_dir() const { return state_dir_; }
  std::string token_file() const { return state_dir_ + "/token"; }
  std::string log_path() const { return state_dir_ + "/lockstepd.log"; }
  std::string job_dir(const std::string& job_id) const { return state_dir_ + "/jobs/" + job_id; }

  // SIGTERM, then waits `grace` plus the daemon's own worker grace; SIGKILL
  // after that. Returns the daemon's exit status as a message when it did
  // not exit 0 on its own.
  Status Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(15000));

 private:
  StandaloneDaemon(pid_t pid, std::string state_dir) : pid_(pid), state_dir_(std::move(state_dir)) {}

  pid_t pid_;
  std::string state_dir_;
  std::string address_;
};

// Appends `data` to `*partial` and hands each complete line (without its
// newline) to `each`; what follows the last newline stays in `*partial`.
void TakeLines(std::string* partial, const std::string& data,
               const std::function<void(const std::string& line)>& each);

// Follows the rank-R.stdout / rank-R.stderr files of a job dir (the agent
// appends to them across restarts) and hands each new complete line to
// `sink` with its rank and stream. Poll(true) also hands over a last line
// without its newline (call it once the workers have exited).
class RankLogTail {
 public:
  using Sink = std::function<void(int rank, bool is_stderr, const std::string& line)>;
  RankLogTail(std::string job_dir, Sink sink) : dir_(std::move(job_dir)), sink_(std::move(sink)) {}

  void Poll(bool final_poll = false);

 private:
  struct File {
    int64_t offset = 0;
    std::string partial;
  };
  std::string dir_;
  Sink sink_;
  std::map<std::string, File> files_;  // by file name
};

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_STANDALONE_H_
