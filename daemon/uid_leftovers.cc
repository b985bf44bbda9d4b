#include "daemon/uid_leftovers.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace lockstep {
namespace daemon {
namespace {

// The names in the open directory `dfd` (not "." or "..").
std::vector<std::string> Names(int dfd) {
  std::vector<std::string> out;
  const int copy = ::dup(dfd);
  if (copy < 0) return out;
  DIR* d = ::fdopendir(copy);
  if (d == nullptr) {
    ::close(copy);
    return out;
  }
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      out.push_back(e->d_name);
    }
  }
  ::closedir(d);
  return out;
}

// Opens `name` in `dfd` as a directory, never through a symlink; -1 if it
// is none.
int OpenDirAt(int dfd, const std::string& name) {
  return ::openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// The parent of the open directory `dir`, reached through its ".." (or a
// dup of `parent`, when that is known: not -1), if the parent's entry
// `name` is still `dir`; -1 otherwise, with `*why` saying why ("moved"
// for a dir swapped meanwhile). `dir` stays open. How the tree walks
// below go back up with one directory open at a time.
int OpenParent(int dir, int parent, const std::string& name, std::string* why) {
  struct stat left, entry;
  if (::fstat(dir, &left) != 0) {
    *why = std::strerror(errno);
    return -1;
  }
  const int up = parent >= 0 ? ::dup(parent)
                             : ::openat(dir, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (up < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  if (::fstatat(up, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0 || entry.st_dev != left.st_dev ||
      entry.st_ino != left.st_ino) {
    ::close(up);
    *why = "moved";
    return -1;
  }
  return up;
}

// Removes `name` in `dfd` and, for a directory, all it holds, to any
// depth with one directory open at a time: it goes down into the first
// subdirectory it finds (removing the other entries on the way), and back
// up through ".." once a directory is empty, checking that the parent's
// entry is still the directory it left. (A tree deeper than the descriptors
// a process may hold is a `mkdir -p` away for a job; a recursion that gave
// up there left the uid unclean for good.)
bool RemoveTreeAt(int dfd, const std::string& name, const std::string& shown,
                  const std::atomic<bool>* stop, Leftovers* out) {
  struct stat st;
  if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
  auto failed = [&](const std::vector<std::string>& where, const char* why) {
    out->errors.push_back(absl::StrCat(shown, where.size() > 1 ? "/" : "",
                                       absl::StrJoin(where.begin() + 1, where.end(), "/"), ": ",
                                       why));
    return false;
  };
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return failed({name}, std::strerror(errno));
    }
    ++out->files;
    return true;
  }
  std::vector<std::string> path = {name};  // from `dfd` down to `cur`
  int cur = OpenDirAt(dfd, name);
  if (cur < 0) return failed(path, std::strerror(errno));
  while (true) {
    if (stop != nullptr && stop->load()) {
      ::close(cur);
      return failed(path, "stopped (the daemon is exiting)");
    }
    std::string down;
    for (const std::string& child : Names(cur)) {
      struct stat cst;
      if (::fstatat(cur, child.c_str(), &cst, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISDIR(cst.st_mode)) {
        down = child;
        break;
      }
      if (::unlinkat(cur, child.c_str(), 0) == 0) {
        ++out->files;
      } else if (errno != ENOENT) {
        std::vector<std::string> at = path;
        at.push_back(child);
        failed(at, std::strerror(errno));
      }
    }
    if (!down.empty()) {
      const int sub = OpenDirAt(cur, down);
      if (sub < 0) {
        path.push_back(down);
        ::close(cur);
        return failed(path, std::strerror(errno));
      }
      ::close(cur);
      cur = sub;
      path.push_back(std::move(down));
      continue;
    }
    // `cur` holds nothing that could be removed: up, and remove it there.
    std::string why;
    const int parent = OpenParent(cur, path.size() == 1 ? dfd : -1, path.back(), &why);
    ::close(cur);
    if (parent < 0) {
      return failed(path, why == "moved" ? "moved while it was being removed" : why.c_str());
    }
    if (::unlinkat(parent, path.back().c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      const int err = errno;
      ::close(parent);
      return failed(path, std::strerror(err));
    }
    ++out->files;
    path.pop_back();
    if (path.empty()) {
      ::close(parent);
      return true;
    }
    cur = parent;
  }
}

// A directory by its device and inode.
using DirId = std::pair<dev_t, ino_t>;

// How deep VisitOwned goes into world-writable directories of others.
constexpr int kMaxSharedDepth = 8;

// Calls `each(dfd, name, shown)` for every entry of the open directory
// `dfd` (shown as `shown`) that `uid` owns, but for the directories in
// `keep`; and, the uid being able to create entries only where it may
// write, does the same inside the world-writable directories of others
// there (a shared 1777 dir under /tmp), on the same file system, to
// kMaxSharedDepth. Stops once `each` returns true, and returns true then.
bool VisitOwned(int dfd, const std::string& shown, uint32_t uid, const std::set<DirId>& keep,
                int depth,
                const std::function<bool(int dfd, const std::string& name, const std::string& shown)>& each) {
  struct stat self;
  if (::fstat(dfd, &self) != 0) return false;
  for (const std::string& name : Names(dfd)) {
    struct stat st;
    if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool dir = S_ISDIR(st.st_mode);
    if (dir && keep.count({st.st_dev, st.st_ino})) continue;
    const std::string child = absl::StrCat(shown, "/", name);
    if (st.st_uid == uid) {
      if (each(dfd, name, child)) return true;
      continue;
    }
    if (!dir || (st.st_mode & S_IWOTH) == 0 || st.st_dev != self.st_dev || depth >= kMaxSharedDepth) {
      continue;
    }
    const int sub = OpenDirAt(dfd, name);
    if (sub < 0) continue;
    const bool stop = VisitOwned(sub, child, uid, keep, depth + 1, each);
    ::close(sub);
    if (stop) return true;
  }
  return false;
}

// The directories `keep` names that exist, by their ids.
std::set<DirId> KeptDirs(const std::vector<std::string>& keep) {
  std::set<DirId> kept;
  for (const std::string& dir : keep) {
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) kept.insert({st.st_dev, st.st_ino});
  }
  return kept;
}

// Calls `each(dfd, dir)` with every one of `dirs` that can be opened as a
// directory (never through a symlink); stops once it returns true.
bool ForEachDir(const std::vector<std::string>& dirs,
                const std::function<bool(int dfd, const std::string& dir)>& each) {
  for (const std::string& dir : dirs) {
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) continue;
    const bool stop = each(dfd, dir);
    ::close(dfd);
    if (stop) return true;
  }
  return false;
}

// The ids of the System V objects `uid` owns or created (an owner may give
// an object away with IPC_SET; its creator stays), from
// /proc/sysvipc/<table>, whose header line names the columns.
std::vector<int> IpcIdsOf(const std::string& table, uint32_t uid) {
  std::vector<int> ids;
  std::ifstream in("/proc/sysvipc/" + table);
  std::string line;
  if (!std::getline(in, line)) return ids;
  const std::vector<std::string> header = absl::StrSplit(line, ' ', absl::SkipEmpty());
  int id_col = -1, uid_col = -1, cuid_col = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    const int col = static_cast<int>(i);
    if (header[i] == "shmid" || header[i] == "semid" || header[i] == "msqid") id_col = col;
    if (header[i] == "uid") uid_col = col;
    if (header[i] == "cuid") cuid_col = col;
  }
  if (id_col < 0 || uid_col < 0 || cuid_col < 0) return ids;
  const size_t need = static_cast<size_t>(std::max({id_col, uid_col, cuid_col})) + 1;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int id = 0;
    uint32_t owner = 0, creator = 0;
    if (f.size() >= need && absl::SimpleAtoi(f[id_col], &id) && absl::SimpleAtoi(f[uid_col], &owner) &&
        absl::SimpleAtoi(f[cuid_col], &creator) && (owner == uid || creator == uid)) {
      ids.push_back(id);
    }
  }
  return ids;
}

}  // namespace

std::vector<std::string> DefaultLeftoverDirs() { return {"/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"}; }

Leftovers RemoveUidLeftovers(uint32_t uid, const std::vector<std::string>& dirs,
                             const std::vector<std::string>& keep, const std::atomic<bool>* stop) {
  Leftovers out;
  const std::set<DirId> kept = KeptDirs(keep);
  ForEachDir(dirs, [&](int dfd, const std::string& dir) {
    return VisitOwned(dfd, dir, uid, kept, 0,
                      [&](int parent, const std::string& name, const std::string& shown) {
                        if (stop != nullptr && stop->load()) return true;
                        if (RemoveTreeAt(parent, name, shown, stop, &out)) ++out.entries;
                        return false;
                      });
  });
  if (stop != nullptr && stop->load()) {
    out.errors.push_back("stopped before the rest (the daemon is exiting)");
    return out;
  }
  auto removed = [&out](const char* what, int id, int rc) {
    if (rc == 0) {
      ++out.ipc;
    } else if (errno != EINVAL && errno != EIDRM) {
      out.errors.push_back(absl::StrCat("System V ", what, " ", id, ": ", std::strerror(errno)));
    }
  };
  for (int id : IpcIdsOf("shm", uid)) removed("shared memory", id, ::shmctl(id, IPC_RMID, nullptr));
  for (int id : IpcIdsOf("sem", uid)) removed("semaphore set", id, ::semctl(id, 0, IPC_RMID));
  for (int id : IpcIdsOf("msg", uid)) removed("message queue", id, ::msgctl(id, IPC_RMID, nullptr));
  return out;
}

std::map<std::string, uint32_t> EntryOwners(const std::string& dir) {
  std::map<std::string, uint32_t> owners;
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return owners;
  for (std::string& name : Names(dfd)) {
    struct stat st;
    if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) owners[std::move(name)] = st.st_uid;
  }
  ::close(dfd);
  return owners;
}

Leftovers RemoveTree(const std::string& path, const std::atomic<bool>* stop) {
  Leftovers out;
  const size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    out.errors.push_back(absl::StrCat(path, ": not a removable path"));
    return out;
  }
  const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    if (errno != ENOENT) out.errors.push_back(absl::StrCat(parent, ": ", std::strerror(errno)));
    return out;
  }
  struct stat st;
  if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      RemoveTreeAt(dfd, name, path, stop, &out)) {
    ++out.entries;
  }
  ::close(dfd);
  return out;
}

Leftovers ChownTree(const std::string& path, uint32_t from, uint32_t uid, uint32_t gid,
                    const std::atomic<bool>* stop) {
  Leftovers out;
  int cur = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (cur < 0) {
    if (errno != ENOENT) out.errors.push_back(absl::StrCat(path, ": ", std::strerror(errno)));
    return out;
  }
  std::vector<std::string> names;  // from `path` down to `cur`
  auto shown = [&](const std::string& last) {
    std::string s = path;
    for (const std::string& n : names) absl::StrAppend(&s, "/", n);
    if (!last.empty()) absl::StrAppend(&s, "/", last);
    return s;
  };
  auto failed = [&](const std::string& last, const char* why) {
    out.errors.push_back(absl::StrCat(shown(last), ": ", why));
  };
  // Gives the open dir `fd` and its entries that are not dirs away; returns
  // its subdirs, the first last (they are visited from the back).
  auto give = [&](int fd) {
    struct stat self;
    if (::fstat(fd, &self) != 0) {
      failed("", std::strerror(errno));
    } else if (self.st_uid == from) {
      if (::fchown(fd, uid, gid) == 0) {
        ++out.files;
      } else {
        failed("", std::strerror(errno));
      }
    }
    std::vector<std::string> subdirs;
    for (std::string& child : Names(fd)) {
      struct stat st;
      if (::fstatat(fd, child.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        subdirs.push_back(std::move(child));
      } else if (st.st_uid != from) {
        continue;  // another's (a hard link to its file), or already given
      } else if (::fchownat(fd, child.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) == 0) {
        ++out.files;
      } else if (errno != ENOENT) {
        failed(child, std::strerror(errno));
      }
    }
    std::reverse(subdirs.begin(), subdirs.end());
    return subdirs;
  };
  // Per level from the top: the subdirs still to visit.
  std::vector<std::vector<std::string>> todo;
  todo.push_back(give(cur));
  while (true) {
    if (stop != nullptr && stop->load()) {
      failed("", "stopped (the daemon is exiting)");
      break;
    }
    if (!todo.back().empty()) {
      std::string down = std::move(todo.back().back());
      todo.back().pop_back();
      const int sub = OpenDirAt(cur, down);
      if (sub < 0) {
        if (errno != ENOENT) failed(down, std::strerror(errno));
        continue;
      }
      ::close(cur);
      cur = sub;
      names.push_back(std::move(down));
      todo.push_back(give(cur));
      continue;
    }
    todo.pop_back();
    if (names.empty()) break;  // back at the top: done
    std::string why;
    const int parent = OpenParent(cur, -1, names.back(), &why);
    if (parent < 0) {
      failed("", why == "moved" ? "moved while its owner was being changed" : why.c_str());
      break;
    }
    ::close(cur);
    cur = parent;
    names.pop_back();
  }
  ::close(cur);
  return out;
}

bool HasUidLeftovers(uint32_t uid, const std::vector<std::string>& dirs,
                     const std::vector<std::string>& keep) {
  const std::set<DirId> kept = KeptDirs(keep);
  if (ForEachDir(dirs, [&](int dfd, const std::string& dir) {
        return VisitOwned(dfd, dir, uid, kept, 0,
                          [](int, const std::string&, const std::string&) { return true; });
      })) {
    return true;
  }
  for (const char* table : {"shm", "sem", "msg"}) {
    if (!IpcIdsOf(table, uid).empty()) return true;
  }
  return false;
}

}  // namespace daemon
}  // namespace lockstep
