// Cleaner: the agent's slow file work, on threads of its own: job uids
// (--job-uids) found for new jobs and given back, the dirs of deleted jobs
// removed, and logs rotated past --max-log-mb (a copy of up to that many
// bytes each).
//
// All of it takes as long as what jobs left. Returning a uid: every
// process of the uid is killed, what it owns in /tmp, /var/tmp, /dev/shm,
// /dev/mqueue and System V IPC is removed (uid_leftovers.h, a walk of all
// of that), and the job dirs it owns under <state_dir>/jobs are given to
// root (a walk of all their files). Deleting a job removes its dir, where
// its workers may have written any number of files. A job that wrote a
// million files takes seconds. Finding a uid for a job lists /proc and
// the same shared dirs (a uid left unclean is never handed out). On the
// agent's loop thread that stalls every heartbeat, start and exit report
// on the node, and past the lease the node fences itself and stops every
// other job's workers. Here it stalls nothing: the agent hands the work
// over and goes on.
//
// Three lanes, a thread each, so that one kind of work never waits behind
// another: cleaning (uids returned, job dirs removed), rotating logs, and
// finding uids (a job start waits for no clean but its own uid's).
//
// A uid's lease is dropped only once the uid is clean, so no job is given
// it (by this or any other lockstepd on the host) before; a deleted job's
// dir is acknowledged to the coordinator only once it is gone
// (TakeRemovedJobDirs). A daemon that stopped mid-clean (or crashed)
// drops its leases with unclean uids; Acquire finds such a uid
// (HasUidLeftovers), cleans it instead of handing it out, and takes it if
// no clean one is free. A uid that cannot be cleaned (an error removing
// what it left) is not tried again for kUncleanRetry.
//
// Thread safety: thread-safe.
#ifndef LOCKSTEP_DAEMON_CLEANER_H_
#define LOCKSTEP_DAEMON_CLEANER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "daemon/uid_lease.h"

namespace lockstep {
namespace daemon {

// How often Drain says what it still waits for.
inline constexpr Duration kCleanProgressInterval = std::chrono::seconds(5);
// How long a stopping agent waits for its uids to be clean (and its job
// dirs removed): with the
// workers' shutdown grace (10 s by default) inside the shipped units'
// TimeoutStopSec=30. What is left then is cleaned when a daemon next needs
// the uid (UidLeases::Acquire's check) or starts on the state dir.
inline constexpr Duration kCleanShutdownLimit = std::chrono::seconds(15);

// How long a uid that could not be cleaned is left alone before a job
// start tries again.
inline constexpr Duration kUncleanRetry = std::chrono::seconds(60);

// How long a uid search waits for the uids it found unclean to be
// cleaned, when no clean one is free, before the start fails.
inline constexpr Duration kUidCleanWait = std::chrono::seconds(60);

struct CleanerOptions {
  // Job dirs (<state_dir>/jobs/<id>) the uid owns go to root; the state dir
  // itself is never swept as a leftover.
  std::string state_dir;
  // Where the uid's files are removed from (uid_leftovers.h).
  std::vector<std::string> leftover_dirs;
  // Called on the lane's thread before each piece of work, named as Drain
  // names it ("uid 70001", a dir, a log, "a uid for job J"); tests hold it
  // there. Default: none.
  std::function<void(const std::string& what)> before_clean;
  // Called once a uid found for a job (or why none) is in TakeAcquired.
  std::function<void()> on_acquired;
  // See kUidCleanWait (tests shorten it).
  Duration uid_clean_wait = kUidCleanWait;
};

class Cleaner {
 public:
  explicit Cleaner(CleanerOptions options);
  // Finishes what is queued (Drain with kCleanShutdownLimit), then stops
  // its thread.
  ~Cleaner();

  // Queues `lease`'s uid to be cleaned, then dropped. `job_id`: the job that
  // had it (logged; its dir is given to root whoever owns it), or empty for
  // a uid found with an earlier job's leftovers.
  void Reclaim(UidLease lease, std::string job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues the removal of deleted job `job_id`'s dir, `dir`, to any depth
  // and never through a symlink (uid_leftovers.h, RemoveTree); once done the
  // job is in TakeRemovedJobDirs, whether or not all of it could go (what
  // could not is logged).
  void RemoveJobDir(std::string job_id, std::string dir) ABSL_LOCKS_EXCLUDED(mu_);
  // The jobs whose dirs were removed since the last call.
  std::vector<std::string> TakeRemovedJobDirs() ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `work` (job `job_id`'s, named `what`: a log rotation); false,
  // queuing nothing, while work of that name is queued or under way.
  bool Run(std::string job_id, std::string what, std::function<void()> work)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Queues finding job `job_id` a uid of `leases`: the lowest free one
  // that is clean (UidLeases::Acquire). Uids found with an earlier job's
  // leftovers are cleaned (Reclaim); if no clean one was free, it waits
  // for those (at most options.uid_clean_wait, saying so every
  // kCleanProgressInterval) and looks once more. The lease, or why there
  // is none, is then in TakeAcquired.
  void Acquire(std::string job_id, UidLeases leases) ABSL_LOCKS_EXCLUDED(mu_);
  // The uids found (or why none) since the last call, by job.
  std::vector<std::pair<std::string, absl::StatusOr<UidLease>>> TakeAcquired()
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether work of `job_id`'s (its uid, dir, a log, a uid being found) is
  // queued or under way: the agent starts the job here again only after
  // (its dir must not change owner under it), and asks for no second
  // removal.
  bool Pending(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // What is queued or under way, per lane, and how many uids are left
  // alone for having failed to clean (kUncleanRetry): the agent's metrics.
  struct Backlog {
    int clean = 0;     // uids returned and deleted jobs' dirs
    int rotate = 0;    // log rotations
    int find_uid = 0;  // uids being found for jobs
    int unclean_uids = 0;
  };
  Backlog Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until nothing is queued or being cleaned, logging every
  // kCleanProgressInterval what is left, or until `limit` has passed: then
  // it stops the work under way and drops what is queued (the leases with
  // it), says which uids and dirs were left, and returns false. Nothing
  // may be queued after a Drain that gave up.
  bool Drain(Duration limit) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum Lane { kCleanLane = 0, kRotateLane = 1, kAcquireLane = 2, kLanes = 3 };
  struct Item {
    UidLease lease;                   // a uid to clean (held), or
    std::string dir;                  // a deleted job's dir to remove, or
    std::function<void()> work;       // work to run, named, or
    std::optional<UidLeases> leases;  // where to find the job a uid
    std::string name;
    std::string job_id;  // whose
    Lane lane() const;
    // What Drain names: "uid 70001", the dir, the work's name, or "a uid
    // for job J".
    std::string What() const;
  };
  struct LaneState {
    std::deque<Item> queue;
    // The item being worked on (its job id and what), if any.
    bool busy = false;
    std::string busy_job;
    std::string busy_what;
    uint32_t busy_uid = 0;  // a clean's
  };
  void Loop(Lane lane) ABSL_LOCKS_EXCLUDED(mu_);
  void Enqueue(Item item) ABSL_LOCKS_EXCLUDED(mu_);
  // Kills, removes and chowns; logs what it did. The lease is held
  // throughout. A uid left unclean is not tried again for kUncleanRetry.
  void Clean(const Item& item) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes item.dir; logs what it did.
  void Remove(const Item& item) const;
  // Acquire's work.
  absl::StatusOr<UidLease> FindUid(const Item& item) ABSL_LOCKS_EXCLUDED(mu_);
  bool Quarantined(uint32_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CleanerOptions options_;
  Logger log_{"agent"};
  mutable Mutex mu_;
  CondVar changed_;  // an item queued or finished, or stop_
  LaneState lanes_[kLanes] ABSL_GUARDED_BY(mu_);
  std::vector<std::string> removed_ ABSL_GUARDED_BY(mu_);  // see TakeRemovedJobDirs
  std::vector<std::pair<std::string, absl::StatusOr<UidLease>>> acquired_ ABSL_GUARDED_BY(mu_);
  // Uids that could not be cleaned, and until when they are left alone.
  std::map<uint32_t, std::chrono::steady_clock::time_point> unclean_until_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Set when a Drain gives up: the clean under way ends between entries.
  std::atomic<bool> cancel_{false};
  std::vector<std::thread> threads_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_CLEANER_H_
