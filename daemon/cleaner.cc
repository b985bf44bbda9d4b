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

Cleaner::Cleaner(CleanerOptions options)
    : options_(std::move(options)), thread_([this] { Loop(); }) {}

Cleaner::~Cleaner() {
  Drain(kCleanShutdownLimit);
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  changed_.SignalAll();
  thread_.join();
}

std::string Cleaner::Item::What() const {
  if (work) return name;
  return dir.empty() ? absl::StrCat("uid ", lease.uid()) : dir;
}

void Cleaner::Enqueue(Item item) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(item));
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

bool Cleaner::Run(std::string job_id, std::string what, std::function<void()> work) {
  {
    MutexLock lock(&mu_);
    if (busy_ && busy_what_ == what) return false;
    for (const Item& item : queue_) {
      if (item.work && item.name == what) return false;
    }
    Item item;
    item.work = std::move(work);
    item.name = std::move(what);
    item.job_id = std::move(job_id);
    queue_.push_back(std::move(item));
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
  if (busy_ && busy_job_ == job_id) return true;
  for (const Item& item : queue_) {
    if (item.job_id == job_id) return true;
  }
  return false;
}

bool Cleaner::Drain(Duration limit) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + limit;
  auto left = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> what;
    if (busy_) what.push_back(busy_what_);
    for (const Item& item : queue_) what.push_back(item.What());
    return absl::StrJoin(what, ", ");
  };
  auto waited = [&start] {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
        .count();
  };
  MutexLock lock(&mu_);
  while (busy_ || !queue_.empty()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      log_.Warn("gave up cleaning {} after {} s: a uid's leftovers are cleaned before any job "
                "is given it again, a job dir stays",
                left(), waited());
      cancel_ = true;
      queue_.clear();  // their leases dropped
      while (busy_) changed_.Wait(&mu_);
      return false;
    }
    if (changed_.WaitWithTimeout(&mu_, std::min<Duration>(kCleanProgressInterval, deadline - now)) &&
        (busy_ || !queue_.empty()) && std::chrono::steady_clock::now() < deadline) {
      log_.Info("still cleaning {} (job uids' processes, job dirs and leftovers; deleted jobs' "
                "dirs) after {} s of at most {} s",
                left(), waited(), ToSeconds(limit));
    }
  }
  return true;
}

void Cleaner::Loop() {
  while (true) {
    Item item;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) changed_.Wait(&mu_);
      if (queue_.empty()) return;  // stop_, and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      busy_job_ = item.job_id;
      busy_what_ = item.What();
    }
    if (options_.before_clean) options_.before_clean(item.What());
    if (item.work) {
      item.work();
    } else if (item.dir.empty()) {
      Clean(item);
    } else {
      Remove(item);
    }
    {
      MutexLock lock(&mu_);
      if (!item.dir.empty() && !item.work) removed_.push_back(item.job_id);
      item = Item();  // the lease dropped: the uid is free again
      busy_ = false;
      busy_job_.clear();
      busy_what_.clear();
    }
    changed_.SignalAll();
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

void Cleaner::Clean(const Item& item) const {
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
  // its own dir whoever owns it (the workers made what is in it), and any
  // other job dir still the uid's (left by a daemon that stopped first).
  const std::string jobs = absl::StrCat(options_.state_dir, "/jobs");
  std::vector<std::string> dirs;
  for (const auto& [name, owner] : EntryOwners(jobs)) {
    if (owner == uid || name == item.job_id) dirs.push_back(name);
  }
  std::vector<std::string> chown_errors;
  for (const std::string& dir : dirs) {
    Leftovers given = ChownTree(absl::StrCat(jobs, "/", dir), 0, 0, &cancel_);
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
