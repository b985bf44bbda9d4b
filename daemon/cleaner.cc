#include "daemon/cleaner.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/uid_leftovers.h"

namespace lockstep {
namespace daemon {
namespace {

// Rounds of "kill every process of the uid" that /proc still lists (after
// KillAllAs, zombies not yet reaped, or a process that was starting).
constexpr int kKillRounds = 5;

// SIGKILLs every process of `uid` at once: a child that becomes `uid` and
// calls kill(-1), which the kernel sends to every process the caller may
// signal (those of its uid) but itself, with forks held off meanwhile, so
// a fork bomb cannot outrun it as a kill per listed pid can. False if the
// child could not be made or become the uid.
bool KillAllAs(uint32_t uid) {
  const pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0) {  // async-signal-safe calls only
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(1);
    ::kill(-1, SIGKILL);
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

Cleaner::Cleaner(CleanerOptions options) : options_(std::move(options)) {
  for (int lane = 0; lane < kLanes; ++lane) {
    threads_.emplace_back([this, lane] { Loop(static_cast<Lane>(lane)); });
  }
}

Cleaner::~Cleaner() {
  Drain(kCleanShutdownLimit);
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  changed_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

Cleaner::Lane Cleaner::Item::lane() const {
  if (work) return kRotateLane;
  if (leases) return kAcquireLane;
  return kCleanLane;
}

std::string Cleaner::Item::What() const {
  if (work) return name;
  if (leases) return absl::StrCat("a uid for job ", job_id);
  return dir.empty() ? absl::StrCat("uid ", lease.uid()) : dir;
}

bool Cleaner::Idle() const {
  for (const LaneState& lane : lanes_) {
    if (lane.busy || !lane.queue.empty()) return false;
  }
  return true;
}

void Cleaner::Enqueue(Item item) {
  {
    MutexLock lock(&mu_);
    const Lane lane = item.lane();
    lanes_[lane].queue.push_back(std::move(item));
  }
  changed_.SignalAll();
}

void Cleaner::Reclaim(UidLease lease, std::string job_id) {
  Item item;
  item.lease = std::move(lease);
  item.job_id = std::move(job_id);
  Enqueue(std::move(item));
}

void Cleaner::RemoveJobDir(std::string job_id, std::string dir) {
  Item item;
  item.dir = std::move(dir);
  item.job_id = std::move(job_id);
  Enqueue(std::move(item));
}

void Cleaner::Acquire(std::string job_id, UidLeases leases) {
  Item item;
  item.leases = std::move(leases);
  item.job_id = std::move(job_id);
  Enqueue(std::move(item));
}

std::vector<std::pair<std::string, absl::StatusOr<UidLease>>> Cleaner::TakeAcquired() {
  MutexLock lock(&mu_);
  std::vector<std::pair<std::string, absl::StatusOr<UidLease>>> out;
  out.swap(acquired_);
  return out;
}

bool Cleaner::Run(std::string job_id, std::string what, std::function<void()> work) {
  {
    MutexLock lock(&mu_);
    LaneState& lane = lanes_[kRotateLane];
    if (lane.busy && lane.busy_what == what) return false;
    for (const Item& item : lane.queue) {
      if (item.name == what) return false;
    }
    Item item;
    item.work = std::move(work);
    item.name = std::move(what);
    item.job_id = std::move(job_id);
    lane.queue.push_back(std::move(item));
  }
  changed_.SignalAll();
  return true;
}

std::vector<std::string> Cleaner::TakeRemovedJobDirs() {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  out.swap(removed_);
  return out;
}

bool Cleaner::Pending(const std::string& job_id) const {
  MutexLock lock(&mu_);
  for (const LaneState& lane : lanes_) {
    if (lane.busy && lane.busy_job == job_id) return true;
    for (const Item& item : lane.queue) {
      if (item.job_id == job_id) return true;
    }
  }
  return false;
}

Cleaner::Backlog Cleaner::Stats() const {
  MutexLock lock(&mu_);
  auto count = [this](Lane which) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const LaneState& lane = lanes_[which];
    return static_cast<int>(lane.queue.size()) + (lane.busy ? 1 : 0);
  };
  Backlog b;
  b.clean = count(kCleanLane);
  b.rotate = count(kRotateLane);
  b.find_uid = count(kAcquireLane);
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [uid, until] : unclean_until_) b.unclean_uids += now < until;
  return b;
}

bool Cleaner::Drain(Duration limit) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + limit;
  auto left = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> what;
    for (const LaneState& lane : lanes_) {
      if (lane.busy) what.push_back(lane.busy_what);
      for (const Item& item : lane.queue) what.push_back(item.What());
    }
    return absl::StrJoin(what, ", ");
  };
  auto waited = [&start] {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
        .count();
  };
  MutexLock lock(&mu_);
  while (!Idle()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      log_.Warn("gave up cleaning {} after {} s: a uid's leftovers are cleaned before any job "
                "is given it again, a job dir stays",
                left(), waited());
      cancel_ = true;
      for (LaneState& lane : lanes_) lane.queue.clear();  // their leases dropped
      changed_.SignalAll();  // an Acquire waiting for a clean
      while (!Idle()) changed_.Wait(&mu_);
      return false;
    }
    if (changed_.WaitWithTimeout(&mu_, std::min<Duration>(kCleanProgressInterval, deadline - now)) &&
        !Idle() && std::chrono::steady_clock::now() < deadline) {
      log_.Info("still cleaning {} (job uids' processes, job dirs and leftovers; deleted jobs' "
                "dirs) after {} s of at most {} s",
                left(), waited(), ToSeconds(limit));
    }
  }
  return true;
}

void Cleaner::Loop(Lane which) {
  while (true) {
    Item item;
    {
      MutexLock lock(&mu_);
      LaneState& lane = lanes_[which];
      while (!stop_ && lane.queue.empty()) changed_.Wait(&mu_);
      if (lane.queue.empty()) return;  // stop_, and nothing left
      item = std::move(lane.queue.front());
      lane.queue.pop_front();
      lane.busy = true;
      lane.busy_job = item.job_id;
      lane.busy_what = item.What();
      lane.busy_uid = which == kCleanLane && item.dir.empty() ? item.lease.uid() : 0;
    }
    if (options_.before_clean) options_.before_clean(item.What());
    std::optional<absl::StatusOr<UidLease>> found;
    if (item.work) {
      item.work();
    } else if (item.leases) {
      found = FindUid(item);
    } else if (item.dir.empty()) {
      Clean(item);
    } else {
      Remove(item);
    }
    {
      MutexLock lock(&mu_);
      LaneState& lane = lanes_[which];
      if (which == kCleanLane && !item.dir.empty()) removed_.push_back(item.job_id);
      if (found) acquired_.emplace_back(item.job_id, *std::move(found));
      item = Item();  // a clean's lease dropped: the uid is free again
      lane.busy = false;
      lane.busy_job.clear();
      lane.busy_what.clear();
      lane.busy_uid = 0;
    }
    changed_.SignalAll();
    if (found && options_.on_acquired) options_.on_acquired();
  }
}

bool Cleaner::Quarantined(uint32_t uid) {
  MutexLock lock(&mu_);
  auto it = unclean_until_.find(uid);
  if (it == unclean_until_.end()) return false;
  if (std::chrono::steady_clock::now() < it->second) return true;
  unclean_until_.erase(it);
  return false;
}

absl::StatusOr<UidLease> Cleaner::FindUid(const Item& item) {
  const Logger log = log_.WithJob(item.job_id);
  std::vector<std::string> look = options_.leftover_dirs;
  const std::string jobs = absl::StrCat(options_.state_dir, "/jobs");
  look.push_back(jobs);
  for (int attempt = 0;; ++attempt) {
    std::vector<UidLease> unclean;
    absl::StatusOr<UidLease> lease = item.leases->Acquire(
        [&](uint32_t uid) {
          return Quarantined(uid) || HasUidLeftovers(uid, look, {options_.state_dir});
        },
        &unclean);
    std::vector<uint32_t> cleaning;
    for (UidLease& dirty : unclean) {
      if (Quarantined(dirty.uid())) continue;  // its lease dropped; left alone for now
      log.Warn("uid {} still owns what an earlier job left (files under {} or {}, or System V "
               "IPC objects): cleaning it before any job is given it",
               dirty.uid(), absl::StrJoin(options_.leftover_dirs, ", "), jobs);
      cleaning.push_back(dirty.uid());
      Reclaim(std::move(dirty), "");
    }
    if (lease.ok() || cleaning.empty() || attempt > 0) return lease;
    // None was free and clean, but some are being cleaned: once they are,
    // one of them will do.
    log.Info("no clean uid free: waiting for uid(s) {} to be cleaned", absl::StrJoin(cleaning, ", "));
    MutexLock lock(&mu_);
    auto being_cleaned = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const LaneState& lane = lanes_[kCleanLane];
      for (uint32_t uid : cleaning) {
        if (lane.busy && lane.busy_uid == uid) return true;
        for (const Item& queued : lane.queue) {
          if (queued.dir.empty() && queued.lease.uid() == uid) return true;
        }
      }
      return false;
    };
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + options_.uid_clean_wait;
    auto next_note = start + kCleanProgressInterval;
    while (!cancel_ && being_cleaned()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return absl::ResourceExhaustedError(absl::StrCat(
            lease.status().message(), "; waited ", ToSeconds(options_.uid_clean_wait), " s for uid(s) ",
            absl::StrJoin(cleaning, ", "), " to be cleaned, and they still are"));
      }
      if (now >= next_note) {
        log.Info("still waiting for uid(s) {} to be cleaned ({} s of at most {} s)",
                 absl::StrJoin(cleaning, ", "),
                 std::chrono::duration_cast<std::chrono::seconds>(now - start).count(),
                 ToSeconds(options_.uid_clean_wait));
        next_note = now + kCleanProgressInterval;
      }
      changed_.WaitWithTimeout(&mu_, std::min<Duration>(next_note - now, deadline - now));
    }
    if (cancel_) return lease;
  }
}

void Cleaner::Remove(const Item& item) const {
  const Logger log = log_.WithJob(item.job_id);
  const auto start = std::chrono::steady_clock::now();
  const Leftovers removed = RemoveTree(item.dir, &cancel_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < removed.errors.size() && i < 5; ++i) {
    log.Error("job deleted; could not remove all of {}: {}", item.dir, removed.errors[i]);
  }
  if (removed.errors.empty() && removed.entries > 0) {
    log.Info("job deleted: removed {} ({} files, logs included; {:.2f} s)", item.dir, removed.files,
             seconds);
  }
}

void Cleaner::Clean(const Item& item) {
  const uint32_t uid = item.lease.uid();
  const Logger log = item.job_id.empty() ? log_ : log_.WithJob(item.job_id);
  const auto start = std::chrono::steady_clock::now();
  // What escaped the workers' process groups (a daemonized helper) must not
  // live on into the next job given this uid.
  size_t killed = 0;
  for (int round = 0; round < kKillRounds; ++round) {
    const std::vector<pid_t> left = ProcessesOfUid(uid);
    if (left.empty()) break;
    if (round == 0 && !KillAllAs(uid)) {
      log.Warn("could not kill uid {}'s processes as that uid: killing them one by one", uid);
    }
    for (pid_t pid : left) ::kill(pid, SIGKILL);
    if (round == 0) killed = left.size();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // their parents reap them
  }
  if (killed > 0) log.Warn("killed {} process(es) still running as uid {}", killed, uid);
  // What it left in the shared temporary dirs and System V IPC, which the
  // next job given the uid would own (uid_leftovers.h), goes first: a hard
  // link there to a file in its job dir must not be given to root with the
  // job dir and stay behind. The state dir may lie under /tmp: its job dirs
  // are never swept.
  const Leftovers files =
      RemoveUidLeftovers(uid, options_.leftover_dirs, {options_.state_dir}, &cancel_);
  // Its files stay readable to `lockstep logs` (root), not to the next job:
  // what it owns in its own dir whoever owns that (the workers made what is
  // in it), and in any other job dir still the uid's (left by a daemon that
  // stopped first).
  const std::string jobs = absl::StrCat(options_.state_dir, "/jobs");
  std::vector<std::string> dirs;
  for (const auto& [name, owner] : EntryOwners(jobs)) {
    if (owner == uid || name == item.job_id) dirs.push_back(name);
  }
  std::vector<std::string> chown_errors;
  for (const std::string& dir : dirs) {
    Leftovers given = ChownTree(absl::StrCat(jobs, "/", dir), uid, 0, 0, &cancel_);
    for (std::string& e : given.errors) chown_errors.push_back(std::move(e));
  }
  for (size_t i = 0; i < chown_errors.size() && i < 5; ++i) {
    log.Warn("could not give uid {}'s job dir to root: {}", uid, chown_errors[i]);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (files.entries > 0 || files.ipc > 0) {
    log.Info("removed what uid {} left: {} entries under {} and {} System V IPC objects ({:.2f} s)",
             uid, files.entries, absl::StrJoin(options_.leftover_dirs, ", "), files.ipc, seconds);
  }
  for (size_t i = 0; i < files.errors.size() && i < 5; ++i) {
    log.Warn("could not remove what uid {} left: {}", uid, files.errors[i]);
  }
  // (Processes still listed are zombies their parents have yet to reap,
  // or were beyond killing: Acquire passes over a uid with any.)
  if ((!files.errors.empty() || !chown_errors.empty()) && !cancel_) {
    {
      MutexLock lock(&mu_);
      unclean_until_[uid] = std::chrono::steady_clock::now() + kUncleanRetry;
    }
    log.Error("uid {} could not be cleaned (see above): no job is given it for {} s, then "
              "cleaning is tried again",
              uid, ToSeconds(kUncleanRetry));
    return;
  }
  if (item.job_id.empty()) {
    log.Info("uid {} cleaned of an earlier job's leftovers ({} job dir(s) given back to root) and "
             "free again",
             uid, dirs.size());
  } else {
    log.Info("uid {} returned; {}/{} given back to root", uid, jobs, item.job_id);
  }
}

}  // namespace daemon
}  // namespace lockstep
