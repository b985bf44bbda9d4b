#include "daemon/orphans.h"

#include <dirent.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace lockstep {
namespace daemon {

bool BecomeChildSubreaper() { return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0; }

namespace {

// The entries of `dir` that are numbers (pids, tids), ascending.
std::vector<pid_t> NumericEntries(const std::string& dir) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    pid_t pid = 0;
    if (absl::SimpleAtoi(e->d_name, &pid)) out.push_back(pid);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<pid_t> AllPids() { return NumericEntries("/proc"); }

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  // Each thread of `parent` lists the children it has in
  // /proc/<parent>/task/<tid>/children (CONFIG_PROC_CHILDREN, set in
  // Debian's kernels): a read per thread, however many processes the host
  // runs. (A child that exits meanwhile may be missed: the caller looks
  // again.)
  const std::string tasks = absl::StrCat("/proc/", parent, "/task");
  if (::access(absl::StrCat(tasks, "/", parent, "/children").c_str(), R_OK) == 0) {
    for (const pid_t tid : NumericEntries(tasks)) {
      std::ifstream in(absl::StrCat(tasks, "/", tid, "/children"));
      pid_t pid = 0;
      while (in >> pid) out.push_back(pid);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  return ChildrenOfByScan(parent);
}

std::vector<pid_t> ChildrenOfByScan(pid_t parent) {
  std::vector<pid_t> out;
  for (const pid_t pid : AllPids()) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
    pid_t ppid = 0;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid) && ppid == parent) {
      out.push_back(pid);
    }
  }
  return out;
}

std::optional<std::map<std::string, std::string>> EnvironOf(pid_t pid,
                                                            const std::vector<std::string>& names) {
  std::map<std::string, std::string> out;
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"));
  if (!in || in.peek() == std::ifstream::traits_type::eof()) return std::nullopt;
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = entry.substr(0, eq);
    // The first of a name counts, as for getenv (and the fence guard).
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      out.emplace(name, entry.substr(eq + 1));
    }
  }
  return out;
}

std::string CommOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/comm"));
  std::string comm;
  if (!std::getline(in, comm) || comm.empty()) return "?";
  return comm;
}

}  // namespace daemon
}  // namespace lockstep
