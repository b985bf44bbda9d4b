#include "daemon/uid_lease.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "daemon/orphans.h"

namespace lockstep {

std::vector<pid_t> ProcessesOfUid(uint32_t uid) {
  std::vector<pid_t> pids;
  for (const pid_t pid : daemon::AllPids()) {
    std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) != 0) continue;
      std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      uint32_t real = 0;
      if (f.size() > 1 && absl::SimpleAtoi(f[1], &real) && real == uid) pids.push_back(pid);
      break;
    }
  }
  return pids;
}

std::string MissingUserSwitchCapabilities() {
  uint64_t effective = 0;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    std::string hex = line.substr(7);
    hex.erase(0, hex.find_first_not_of(" \t"));
    if (!absl::SimpleHexAtoi(hex, &effective)) effective = 0;
    break;
  }
  // Bit numbers from linux/capability.h.
  constexpr std::pair<int, const char*> kNeeded[] = {
      {7, "CAP_SETUID"}, {6, "CAP_SETGID"}, {0, "CAP_CHOWN"}, {5, "CAP_KILL"}};
  std::string missing;
  for (const auto& [bit, name] : kNeeded) {
    if ((effective >> bit) & 1) continue;
    absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  }
  return missing;
}

namespace {

bool NamedInUserDatabase(uint32_t uid) {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[4096];
  return ::getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr;
}

absl::Status MakePrivateDir(const std::string& path) {
  // Parents (/run/lockstep) as plain 0755 dirs; the last one private.
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string parent = path.substr(0, slash);
    if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("uid lease dir: cannot make ", parent, ": ", std::strerror(errno)));
    }
  }
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("uid lease dir: cannot make ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status UidLeases::Prepare() const {
  if (dir_.empty() || dir_[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("uid lease dir \"", dir_, "\" is not an absolute path"));
  }
  if (absl::Status made = MakePrivateDir(dir_); !made.ok()) return made;
  struct stat st;
  if (::lstat(dir_.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("uid lease dir ", dir_, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("uid lease dir ", dir_, " is not a directory (a symlink is refused)"));
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "uid lease dir ", dir_, " must be this daemon's (uid ", ::geteuid(),
        ") with no access for others; it is uid ", st.st_uid, " mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), " (whoever may write there can take "
        "or hold jobs' uids)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UidLease> UidLeases::Lock(uint32_t uid) const {
  const std::string path = absl::StrCat(dir_, "/", uid);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("uid lease ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::UnavailableError(absl::StrCat("uid ", uid, " is leased (", path, ")"));
  }
  return UidLease(uid, std::move(fd));
}

absl::StatusOr<UidLease> UidLeases::Take(uint32_t uid) const {
  if (absl::Status ready = Prepare(); !ready.ok()) return ready;
  if (uid < first_ || uid > last_) {
    return absl::FailedPreconditionError(
        absl::StrCat("uid ", uid, " is outside the job uid range ", first_, "-", last_));
  }
  return Lock(uid);
}

absl::StatusOr<UidLease> UidLeases::Acquire(const std::function<bool(uint32_t uid)>& unclean,
                                            std::vector<UidLease>* to_clean) const {
  if (absl::Status ready = Prepare(); !ready.ok()) return ready;
  int held = 0, named = 0, busy = 0, dirty = 0;
  for (uint64_t uid = first_; uid <= last_; ++uid) {
    absl::StatusOr<UidLease> locked = Lock(static_cast<uint32_t>(uid));
    if (absl::IsUnavailable(locked.status())) {
      ++held;
      continue;
    }
    if (!locked.ok()) return locked.status();
    UidLease lease = *std::move(locked);
    // Locked, but not necessarily free: an account of that number, or
    // processes left by a daemon that died (they escaped its process
    // groups), would share the job's uid.
    if (NamedInUserDatabase(lease.uid())) {
      ++named;
      continue;
    }
    if (!ProcessesOfUid(lease.uid()).empty()) {
      ++busy;
      continue;
    }
    if (unclean && unclean(lease.uid())) {
      ++dirty;
      if (to_clean != nullptr) to_clean->push_back(std::move(lease));
      continue;
    }
    return lease;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "no free uid for this job in ", first_, "-", last_, ": ", held,
      " leased to running jobs or being cleaned (in ", dir_, ", by this or another lockstepd), ",
      named, " named in the user database, ", busy, " with processes no lockstepd leases, ", dirty,
      " with an earlier job's files or IPC objects left"));
}

}  // namespace lockstep
