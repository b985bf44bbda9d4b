#include "daemon/oom.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace lockstep {
namespace daemon {

bool ParseKmsgRecord(absl::string_view record, int64_t* time_us, std::string* text) {
  const size_t semi = record.find(';');
  if (semi == absl::string_view::npos || record.empty() || record[0] == ' ') return false;
  const std::vector<absl::string_view> fields = absl::StrSplit(record.substr(0, semi), ',');
  int64_t prio = 0, seq = 0;
  if (fields.size() < 4 || !absl::SimpleAtoi(fields[0], &prio) ||
      !absl::SimpleAtoi(fields[1], &seq) || !absl::SimpleAtoi(fields[2], time_us)) {
    return false;
  }
  absl::string_view rest = record.substr(semi + 1);
  // /dev/kmsg ends a record's text with a newline; key=value lines follow.
  rest = rest.substr(0, rest.find('\n'));
  *text = std::string(rest);
  return true;
}

bool IsOomKillOf(absl::string_view text, pid_t pid) {
  // "Out of memory: Killed process 1356 (python3) total-vm:...", and
  // "Memory cgroup out of memory: Killed process 1356 (python3) ...".
  const std::string want = absl::StrCat("Killed process ", pid, " (");
  const bool oom = text.find("Out of memory") != absl::string_view::npos ||
                   text.find("out of memory") != absl::string_view::npos;
  return oom && text.find(want) != absl::string_view::npos;
}

std::optional<std::string> FindOomKill(pid_t pid, int64_t since_mono_ns, const std::string& kmsg,
                                       bool* readable) {
  if (readable != nullptr) *readable = false;
  const int fd = kmsg.empty() ? -1 : ::open(kmsg.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> found;
  const int64_t since_us = (since_mono_ns - kKernelLogSlackNs) / 1000;
  std::string buf(64 * 1024, '\0');
  std::string pending;  // a file's partial last line
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) continue;  // records overwritten meanwhile: go on
    // EAGAIN: the end of the log (/dev/kmsg); 0: a file's end.
    const bool read_ok = n >= 0 || errno == EAGAIN;
    if (read_ok && readable != nullptr) *readable = true;
    if (n <= 0) break;
    pending.append(buf.data(), n);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      int64_t time_us = 0;
      std::string text;
      if (ParseKmsgRecord(absl::string_view(pending).substr(start, nl - start), &time_us, &text) &&
          time_us >= since_us && IsOomKillOf(text, pid)) {
        found = text;  // the last one
      }
    }
    pending.erase(0, start);
  }
  ::close(fd);
  return found;
}

namespace {

// The memory cgroup's line of /proc/<pid>/cgroup text: its path, and
// whether it is the v1 memory hierarchy's (else v2's "0::" line).
std::optional<std::pair<std::string, bool>> MemoryCgroupPath(absl::string_view proc_cgroup) {
  std::optional<std::pair<std::string, bool>> v2;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    // "<id>:<controllers>:<path>"; the path may hold ':'.
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    if (f[0] == "0" && f[1].empty()) {
      v2 = std::make_pair(std::string(f[2]), false);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(f[1], ',')) {
      if (controller == "memory") return std::make_pair(std::string(f[2]), true);
    }
  }
  return v2;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::optional<OomCounter> OomCounterOf(absl::string_view proc_cgroup, const std::string& cgroup_root,
                                       absl::string_view self_proc_cgroup) {
  const std::optional<std::pair<std::string, bool>> found = MemoryCgroupPath(proc_cgroup);
  if (!found) return std::nullopt;
  const auto& [cgroup, v1] = *found;
  auto file = [&, v1 = v1](absl::string_view path) {
    if (path == "/") path = "";
    return v1 ? absl::StrCat(cgroup_root, "/memory", path, "/memory.oom_control")
              : absl::StrCat(cgroup_root, path, "/memory.events");
  };
  OomCounter counter{cgroup, file(cgroup)};
  // A container that mounts its own cgroup as the hierarchy's root while
  // /proc names the host's path (cgroup v1 without a cgroup namespace):
  // the path below this process's own cgroup, from that root.
  if (!Exists(counter.file) && !self_proc_cgroup.empty()) {
    const std::optional<std::pair<std::string, bool>> self = MemoryCgroupPath(self_proc_cgroup);
    if (self && self->second == v1 && self->first != "/" &&
        (cgroup == self->first || absl::StartsWith(cgroup, absl::StrCat(self->first, "/")))) {
      const std::string below = file(absl::string_view(cgroup).substr(self->first.size()));
      if (Exists(below)) counter.file = below;
    }
  }
  return counter;
}

std::optional<OomCounter> OomCounterOfPid(pid_t pid) {
  auto read = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::optional<std::string> text = read(absl::StrCat("/proc/", pid, "/cgroup"));
  if (!text) return std::nullopt;
  // A process that has exited shows the root cgroup on v1 hierarchies: one
  // not exited after the read was not when it was read.
  const std::optional<std::string> stat = read(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat ? stat->rfind(')') : std::string::npos;
  if (close == std::string::npos || close + 2 >= stat->size() || (*stat)[close + 2] == 'Z' ||
      (*stat)[close + 2] == 'X') {
    return std::nullopt;
  }
  return OomCounterOf(*text, "/sys/fs/cgroup", read("/proc/self/cgroup").value_or(""));
}

std::optional<int64_t> ReadOomKills(const std::string& file) {
  std::ifstream in(file);
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

}  // namespace daemon
}  // namespace lockstep
