// Host-wide leases on the uids jobs run as (--job-uids), like systemd's
// DynamicUser: a uid is one job's while this daemon holds an exclusive
// flock(2) on <dir>/<uid>. Two lockstepds on one host (a coordinator and an
// agent, or test daemons side by side) therefore never give two jobs the same
// uid, and releasing a uid, which kills every process still running as it,
// cannot hit another daemon's workers. A lock dies with its daemon, so a
// crashed daemon's uids come free by themselves; a uid with no lease that
// still has processes, or one that names an account in the user database, is
// never handed out.
#ifndef LOCKSTEP_DAEMON_UID_LEASE_H_
#define LOCKSTEP_DAEMON_UID_LEASE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace lockstep {

// Where leases live unless --uid-lease-dir says otherwise: /run is per boot,
// as a lease is.
inline constexpr char kDefaultUidLeaseDir[] = "/run/lockstep/job-uids";

// The range a root lockstepd gives jobs when neither --job-uids nor --run-as
// is set: above the 16-bit range (Debian policy keeps 65536 and up for
// dynamically allocated accounts, and adduser does not allocate there),
// below the 100000 where useradd starts subordinate uid ranges.
inline constexpr uint32_t kDefaultJobUidFirst = 70000;
inline constexpr uint32_t kDefaultJobUidLast = 70999;

// Every process whose real uid is `uid`, read from /proc.
std::vector<pid_t> ProcessesOfUid(uint32_t uid);

// The capabilities a daemon needs to run jobs as uids of their own
// (CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_KILL) that this process's
// effective set lacks, named ("CAP_SETUID, CAP_SETGID"); empty when it has
// them all. A root daemon in a container or unit that dropped them is root
// but cannot switch users.
std::string MissingUserSwitchCapabilities();

// One held uid: the lock goes with the descriptor, when this does.
class UidLease {
 public:
  UidLease() = default;
  UidLease(uint32_t uid, UniqueFd fd) : uid_(uid), fd_(std::move(fd)) {}

  uint32_t uid() const { return uid_; }
  bool held() const { return fd_.valid(); }

 private:
  uint32_t uid_ = 0;
  UniqueFd fd_;
};

class UidLeases {
 public:
  // [first, last] under `dir`, which is made (0700) if missing and must
  // belong to this process's uid with no access for others.
  UidLeases(std::string dir, uint32_t first, uint32_t last)
      : dir_(std::move(dir)), first_(first), last_(last) {}

  // Makes and checks the lease dir; lockstepd calls it at start, so that a
  // bad --uid-lease-dir is refused before any job arrives.
  absl::Status Prepare() const;

  // The lowest free uid of the range, locked. It runs Prepare again first
  // (one mkdir and lstat per job): a dir under /run may have been removed
  // or replaced since the daemon started, and a lease file made in a dir
  // others can write would not be safe. RESOURCE_EXHAUSTED when none
  // is free, saying how many were held here, by other daemons, named in the
  // user database, busy with processes or left unclean.
  //
  // `unclean`, if given, is asked about each uid that is otherwise free:
  // true means an earlier job's leftovers are still there (a daemon that
  // stopped before removing them). Such a uid is not handed out; its lease
  // goes into `*to_clean`, for the caller to clean it and then drop it.
  absl::StatusOr<UidLease> Acquire(const std::function<bool(uint32_t uid)>& unclean = nullptr,
                                   std::vector<UidLease>* to_clean = nullptr) const;

  // `uid`'s lease, if no one holds it: for a uid this daemon knows was its
  // own (a job dir of its state dir still the uid's), whatever else uses it
  // now. UNAVAILABLE while another holds it; FAILED_PRECONDITION for a bad
  // lease dir or a uid outside the range.
  absl::StatusOr<UidLease> Take(uint32_t uid) const;

  const std::string& dir() const { return dir_; }

 private:
  // The lease file's lock; UNAVAILABLE while another holds it.
  absl::StatusOr<UidLease> Lock(uint32_t uid) const;

  std::string dir_;
  uint32_t first_;
  uint32_t last_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_UID_LEASE_H_
