// FenceGuard: stops a frozen agent's workers that do not stop themselves.
//
// A worker that links the engine kills its own process group once the
// node's fence page (common/worker_link.h) passes its deadline, so it is
// gone by the time the coordinator hands its rank to another node even when
// its agent is frozen (SIGSTOP, a hung daemon) and can stop nobody. Any
// other program (a script, a binary that does not call ddp::InitFromEnv, a
// worker that dropped LOCKSTEP_FENCE_FD from its environment) would run on
// and its rank would have two owners.
//
// The guard is a small process the agent forks when it starts (no exec: it
// runs a loop of async-signal-safe calls on memory it shares with the
// agent). Every 50 ms it reads the fence deadline; once it has passed (by
// 200 ms: a worker that fences itself does so first and says so), it
// SIGKILLs the process group of every worker the agent listed with Watch
// and not yet forgotten, once per listing, writes one line to stderr per
// group (the daemon's log: spdlog cannot be used in a forked child) and
// stamps when on the listing, so that the agent, once it runs again, can
// say who killed its worker. A worker already dead (a zombie: its agent
// killed it at the same deadline and has not reaped it yet) is not claimed:
// its group's stragglers are killed, nothing is said or stamped. The deadline is the one engine workers obey
// (the agent's last accepted heartbeat + lease + lease/4), so the guard and
// the engine fence within 200 ms of each other, before the coordinator's
// fence deadline for the node (a second later).
//
// The guard is a process of its own (its own process group too), so
// stopping the agent's process, or its group, does not stop it. It ends
// when the agent closes its end of a pipe: at ~FenceGuard, or when the
// agent's process dies however it dies (a kill -9 of the agent: its workers
// die with it through PR_SET_PDEATHSIG).
//
// A process a worker moved out of its process group (setsid, a double fork)
// is not in the group the guard kills. Past the deadline the guard also
// looks through /proc for processes in its agent's tree (the agent is their
// child subreaper once their parent died, daemon/orphans.h) whose
// environment names this agent (LOCKSTEP_AGENT), or, where the environment
// cannot be read (another uid's: that takes CAP_SYS_PTRACE), that run as
// one of the node's job uids; SIGKILLs them (with their group, if they lead
// one) and says so: after the listed groups, and again while it kills new
// ones or is unsure of some (an exec under way, an ancestor exiting), for a
// second at most.
//
// Limits: a helper that cleared its environment, or left the agent's tree
// (a daemon without the subreaper's right), is not found, as by the
// agent's orphan sweep; a listing forgotten a moment after its process was reaped
// may name a pid the kernel already reused, as any kill(-pgid) after a reap
// may (the guard kills only past the fence, when every worker of the node
// must be gone anyway).
//
// Thread safety: Watch, Forget and KilledNs may be called from any thread,
// one Entry by one thread at a time.
#ifndef LOCKSTEP_DAEMON_FENCE_GUARD_H_
#define LOCKSTEP_DAEMON_FENCE_GUARD_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/worker_link.h"

namespace lockstep {
namespace daemon {

class FenceGuard {
 public:
  // How many workers the guard can list at once; Watch beyond that returns
  // an entry that guards nothing (guarded() false).
  static constexpr int kSlots = 1024;
  // How many bytes of a job id a listing keeps (for the guard's line).
  static constexpr int kJobIdBytes = 48;
  // How many bytes of the agent's LOCKSTEP_AGENT it keeps (SetAgent).
  static constexpr int kAgentBytes = 256;
  // The guard process's name (/proc/PID/comm, what ps shows).
  static constexpr char kProcessName[] = "lockstepd-fence";

  struct Slot;    // shared with the guard process (fence_guard.cc)
  struct Marker;  // likewise

  // One worker's listing; forgotten when destroyed. Move-only.
  class Entry {
   public:
    Entry() = default;
    ~Entry() { Forget(); }
    Entry(Entry&& other) noexcept { *this = std::move(other); }
    Entry& operator=(Entry&& other) noexcept;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    bool guarded() const { return guard_ != nullptr; }
    // When the guard SIGKILLed this worker's group (CLOCK_MONOTONIC ns),
    // 0 when it did not.
    int64_t KilledNs() const;
    // Drops the listing: the guard no longer kills that group. Call once
    // the worker was reaped (the destructor does).
    void Forget();

   private:
    friend class FenceGuard;
    FenceGuard* guard_ = nullptr;
    int slot_ = -1;
    uint32_t seq_ = 0;  // the listing's sequence number in its slot
  };

  // Forks the guard process, watching `fence`'s deadline (the page is
  // shared memory; `fence` must outlive this object). Unavailable when the
  // memory, the pipe or the fork cannot be had.
  static StatusOr<std::unique_ptr<FenceGuard>> Start(const worker_link::FencePage* fence);
  // Ends the guard process and reaps it.
  ~FenceGuard();
  FenceGuard(const FenceGuard&) = delete;
  FenceGuard& operator=(const FenceGuard&) = delete;

  // Lists process group `pgid` (a worker that leads its own group) as job
  // `job_id`'s `rank` in `round`.
  Entry Watch(pid_t pgid, absl::string_view job_id, int rank, int64_t round);

  // The value of LOCKSTEP_AGENT in this agent's workers' environment (at
  // most kAgentBytes - 1 bytes): past the deadline, processes in this
  // process's tree that carry it and left their worker's group are killed
  // too. Until it is set, only the listed groups are.
  void SetAgent(absl::string_view agent);

  // The node's job uids (lockstepd --job-uids; 0, 0: none). Past the
  // deadline, a process in this process's tree whose environment cannot be
  // read (another uid's, without CAP_SYS_PTRACE) is killed when it runs as
  // one of them.
  void SetJobUids(uint32_t first, uint32_t last);

  // The guard process (the agent's orphan sweep leaves it alone).
  pid_t pid() const { return pid_; }

  // Whether the guard process ended (it is reaped here), and how ("killed
  // by signal 9"); nullopt while it runs. The agent looks every second.
  std::optional<std::string> Ended();
  // Starts a new guard process over the same listings (after Ended).
  Status Restart();

 private:
  FenceGuard() = default;
  // Forks the guard process over slots_.
  Status Spawn();
  void Release(int slot, uint32_t seq);

  const worker_link::FencePage* fence_ = nullptr;
  Slot* slots_ = nullptr;  // kSlots of them, MAP_SHARED with the guard
  Marker* marker_ = nullptr;  // after them, in the same mapping
  void* scratch_ = nullptr;  // the guard's sweeps' (private)
  pid_t pid_ = -1;
  int pipe_write_ = -1;  // closed: the guard ends
  Mutex mu_;             // claims a free slot; writes the marker
  int next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_FENCE_GUARD_H_
