#include "daemon/oom.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

std::optional<std::string> FindOomKill(pid_t pid, int64_t since_mono_ns, const std::string& kmsg) {
  const int fd = ::open(kmsg.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> found;
  const int64_t since_us = (since_mono_ns - kKernelLogSlackNs) / 1000;
  std::string buf(64 * 1024, '\0');
  std::string pending;  // a file's partial last line
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) continue;  // records overwritten meanwhile: go on
    if (n <= 0) break;                      // EAGAIN: the end of the log
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

}  // namespace daemon
}  // namespace lockstep
