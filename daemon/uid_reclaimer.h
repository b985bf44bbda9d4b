// UidReclaimer: gives job uids (--job-uids) back, on a thread of its own.
//
// Returning a uid is slow in proportion to what the job left: every
// process of the uid is killed, the job dirs it owns under
// <state_dir>/jobs are given to root (a walk of all their files), and what
// it owns in /tmp, /var/tmp, /dev/shm, /dev/mqueue and System V IPC is
// removed (uid_leftovers.h, a walk of all of that). A job that wrote a
// million files into /tmp takes seconds to clean. On the agent's loop
// thread that stalls every heartbeat, start and exit report on the node,
// and past the lease the node fences itself and stops every other job's
// workers. Here it stalls nothing: the agent hands over the uid's lease
// and goes on; the lease is dropped only once the uid is clean, so no job
// is given the uid (by this or any other lockstepd on the host) before.
//
// A daemon that stopped mid-clean (or crashed) drops its leases with
// unclean uids; UidLeases::Acquire, given the agent's check
// (HasUidLeftovers), passes such a uid here instead of handing it out.
//
// Thread safety: thread-safe.
#ifndef LOCKSTEP_DAEMON_UID_RECLAIMER_H_
#define LOCKSTEP_DAEMON_UID_RECLAIMER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "daemon/uid_lease.h"

namespace lockstep {
namespace daemon {

// How often Drain says which uids it still waits for.
inline constexpr Duration kReclaimProgressInterval = std::chrono::seconds(5);
// How long a stopping agent waits for its uids to be clean: with the
// workers' shutdown grace (10 s by default) inside the shipped units'
// TimeoutStopSec=30. What is left then is cleaned when a daemon next needs
// the uid (UidLeases::Acquire's check) or starts on the state dir.
inline constexpr Duration kReclaimShutdownLimit = std::chrono::seconds(15);

struct UidReclaimerOptions {
  // Job dirs (<state_dir>/jobs/<id>) the uid owns go to root; the state dir
  // itself is never swept as a leftover.
  std::string state_dir;
  // Where the uid's files are removed from (uid_leftovers.h).
  std::vector<std::string> leftover_dirs;
  // Called on the reclaimer's thread before each uid is cleaned (tests hold
  // it there). Default: none.
  std::function<void(uint32_t uid)> before_clean;
};

class UidReclaimer {
 public:
  explicit UidReclaimer(UidReclaimerOptions options);
  // Finishes what is queued (Drain with kReclaimShutdownLimit), then stops
  // its thread.
  ~UidReclaimer();

  // Queues `lease`'s uid to be cleaned, then dropped. `job_id`: the job that
  // had it (logged; its dir is given to root whoever owns it), or empty for
  // a uid found with an earlier job's leftovers.
  void Reclaim(UidLease lease, std::string job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `job_id`'s uid is queued or being cleaned: the agent starts the
  // job here again only after (its dir must not change owner under it).
  bool Pending(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until nothing is queued or being cleaned, logging every
  // kReclaimProgressInterval which uids are left, or until `limit` has
  // passed: then it stops the clean under way and drops what is queued
  // (their leases with them), says which uids were left unclean, and
  // returns false. Reclaim must not be called after a Drain that gave up.
  bool Drain(Duration limit) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    UidLease lease;
    std::string job_id;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Kills, chowns and removes; logs what it did. The lease is held throughout.
  void Clean(const Item& item) const;

  const UidReclaimerOptions options_;
  Logger log_{"agent"};
  mutable Mutex mu_;
  CondVar changed_;  // an item queued or finished, or stop_
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  // The one being cleaned (its job id and uid), if any.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::string busy_job_ ABSL_GUARDED_BY(mu_);
  uint32_t busy_uid_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Set when a Drain gives up: the clean under way ends between entries.
  std::atomic<bool> cancel_{false};
  std::thread thread_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_UID_RECLAIMER_H_
