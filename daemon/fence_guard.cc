#include "daemon/fence_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/worker_env.h"

namespace lockstep {
namespace daemon {

// One listing. The agent writes it under a sequence lock (seq odd while it
// writes); the guard reads it and writes only killed_ns and killed_for.
// Every field is an atomic: the two processes share it.
struct FenceGuard::Slot {
  static constexpr int kJobWords = kJobIdBytes / 8;
  std::atomic<uint32_t> seq{0};
  std::atomic<int32_t> pgid{0};  // 0: free
  std::atomic<int32_t> rank{0};
  std::atomic<int64_t> round{0};
  std::atomic<uint64_t> job[kJobWords] = {};
  // The guard's kill of the listing with sequence number killed_for.
  std::atomic<uint32_t> killed_for{0};
  std::atomic<int64_t> killed_ns{0};
};

// The agent's LOCKSTEP_AGENT value (its address, known once it listens),
// under a sequence lock as the slots are.
struct FenceGuard::Marker {
  static constexpr int kWords = kAgentBytes / 8;
  std::atomic<uint32_t> seq{0};
  std::atomic<uint64_t> text[kWords] = {};
  // The node's job uids (SetJobUids; 0, 0: none), outside the lock: each
  // is one word, and the range is set once.
  std::atomic<uint32_t> uid_first{0};
  std::atomic<uint32_t> uid_last{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "atomics shared with another process");

namespace {

// Text kept in shared atomics, 8 bytes to a word (read and written under
// the owner's sequence lock). StoreText keeps at most 8 * words - 1 bytes
// and pads with NULs; LoadText fills out[0 .. 8 * words).
void StoreText(std::atomic<uint64_t>* text, int words, absl::string_view value) {
  static_assert(FenceGuard::kJobIdBytes <= FenceGuard::kAgentBytes, "the longest text kept");
  char padded[FenceGuard::kAgentBytes] = {};
  std::memcpy(padded, value.data(), std::min<size_t>(value.size(), 8 * words - 1));
  for (int w = 0; w < words; ++w) {
    uint64_t word;
    std::memcpy(&word, padded + 8 * w, 8);
    text[w].store(word, std::memory_order_relaxed);
  }
}
void LoadText(const std::atomic<uint64_t>* text, int words, char* out) {
  for (int w = 0; w < words; ++w) {
    const uint64_t word = text[w].load(std::memory_order_relaxed);
    std::memcpy(out + 8 * w, &word, 8);
  }
}

// The writer's side of a sequence lock (the agent's, under its mutex):
// `seq` odd while `write` runs, then two past where it was. Returns that.
template <typename Write>
uint32_t WriteUnderSeq(std::atomic<uint32_t>& seq, Write write) {
  const uint32_t was = seq.load(std::memory_order_relaxed);
  seq.store(was + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  write();
  seq.store(was + 2, std::memory_order_release);
  return was + 2;
}

constexpr size_t kSlotBytes = sizeof(FenceGuard::Slot) * FenceGuard::kSlots;
constexpr size_t kSharedBytes = kSlotBytes + sizeof(FenceGuard::Marker);
constexpr int kTickMs = 50;
// The guard acts this long after the deadline, so that a worker that fences
// itself (the engine checks every 50 ms) does so first and says so on its
// stderr. The coordinator hands the node's ranks out a second after it.
constexpr int64_t kAfterDeadlineNs = 200 * 1000000LL;

// ------------------------------------------------ the guard process's side
// Only async-signal-safe calls from here on (the agent that forked it has
// other threads), and no allocation.

// Appends `s` to buf[*n..cap).
void Put(char* buf, size_t* n, size_t cap, const char* s, size_t len) {
  len = std::min(len, cap - *n);
  std::memcpy(buf + *n, s, len);
  *n += len;
}
void PutStr(char* buf, size_t* n, size_t cap, const char* s) { Put(buf, n, cap, s, std::strlen(s)); }
void PutInt(char* buf, size_t* n, size_t cap, int64_t v) {
  char digits[24];
  int d = 0;
  const bool negative = v < 0;
  uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  do {
    digits[d++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (negative) digits[d++] = '-';
  while (d > 0) Put(buf, n, cap, &digits[--d], 1);
}

// Appends `v` as `width` digits, zero-padded.
void PutPadded(char* buf, size_t* n, size_t cap, int64_t v, int width) {
  char digits[20];
  for (int i = width - 1; i >= 0; --i) {
    digits[i] = static_cast<char>('0' + v % 10);
    v /= 10;
  }
  Put(buf, n, cap, digits, static_cast<size_t>(width));
}

// Appends the UTC time now as the daemon's log lines begin
// ("2026-11-29T12:23:27.214Z"; common/logging.cc's pattern). The civil date
// from the days since 1970-01-01 by the proleptic Gregorian calendar's
// 400-year eras (146097 days each), counted from March so that the leap day
// ends a year.
void PutUtcNow(char* buf, size_t* n, size_t cap) {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t secs = ts.tv_sec;
  int64_t days = secs / 86400;
  int64_t rem = secs % 86400;
  if (rem < 0) {
    rem += 86400;
    --days;
  }
  const int64_t z = days + 719468;  // days since 0000-03-01
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;                                  // [0, 146096]
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;  // [0, 399]
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);           // [0, 365]
  const int64_t mp = (5 * doy + 2) / 153;                                // [0, 11], March = 0
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  PutPadded(buf, n, cap, year, 4);
  PutStr(buf, n, cap, "-");
  PutPadded(buf, n, cap, month, 2);
  PutStr(buf, n, cap, "-");
  PutPadded(buf, n, cap, day, 2);
  PutStr(buf, n, cap, "T");
  PutPadded(buf, n, cap, rem / 3600, 2);
  PutStr(buf, n, cap, ":");
  PutPadded(buf, n, cap, rem / 60 % 60, 2);
  PutStr(buf, n, cap, ":");
  PutPadded(buf, n, cap, rem % 60, 2);
  PutStr(buf, n, cap, ".");
  PutPadded(buf, n, cap, ts.tv_nsec / 1000000, 3);
  PutStr(buf, n, cap, "Z");
}

// A process as /proc/<pid>/stat shows it.
struct ProcRow {
  int32_t pid;
  int32_t ppid;
  int32_t pgid;
  char state;
};

// Builds "/proc/<pid>/<file>" into `path` (64 bytes).
void ProcPath(char* path, pid_t pid, const char* file) {
  size_t n = 0;
  PutStr(path, &n, 63, "/proc/");
  PutInt(path, &n, 63, pid);
  PutStr(path, &n, 63, "/");
  PutStr(path, &n, 63, file);
  path[n] = '\0';
}

// Parses a decimal number at s[*i], moving past it; -1 when there is none.
int64_t ParseInt(const char* s, ssize_t len, ssize_t* i) {
  int64_t v = 0;
  bool any = false;
  bool negative = false;
  if (*i < len && s[*i] == '-') {
    negative = true;
    ++*i;
  }
  while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
    v = v * 10 + (s[*i] - '0');
    ++*i;
    any = true;
  }
  if (!any) return -1;
  return negative ? -v : v;
}

// Reads /proc/<pid>/stat into `row` (and the command name into `comm`,
// when given); false when the process is gone.
bool ReadStat(pid_t pid, ProcRow* row, char* comm = nullptr, size_t comm_cap = 0) {
  char path[64];
  ProcPath(path, pid, "stat");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t got = ::read(fd, stat, sizeof(stat));
  ::close(fd);
  if (got <= 0) return false;
  // "pid (comm) S ppid pgrp ...": the comm may hold anything, so the fields
  // follow its last ')'.
  ssize_t close_paren = -1;
  for (ssize_t i = got - 1; i >= 0; --i) {
    if (stat[i] == ')') {
      close_paren = i;
      break;
    }
  }
  if (close_paren < 0 || close_paren + 4 >= got) return false;
  if (comm != nullptr) {
    size_t n = 0;
    for (ssize_t i = 0; i < close_paren; ++i) {
      if (stat[i] == '(') {
        Put(comm, &n, comm_cap - 1, stat + i + 1, static_cast<size_t>(close_paren - i - 1));
        break;
      }
    }
    comm[n] = '\0';
  }
  row->pid = pid;
  row->state = stat[close_paren + 2];
  ssize_t i = close_paren + 4;
  row->ppid = static_cast<int32_t>(ParseInt(stat, got, &i));
  ++i;
  row->pgid = static_cast<int32_t>(ParseInt(stat, got, &i));
  return true;
}

// Whether process `pid` runs: not gone, and not a zombie its parent has not
// reaped yet (a worker the agent itself killed a moment ago).
bool Runs(pid_t pid) {
  ProcRow row{};
  return ReadStat(pid, &row) && row.state != 'Z' && row.state != 'X';
}

// This process's pid and its parent's as /proc numbers them (the pid
// namespace /proc was mounted for may not be this process's own); 0 when
// /proc does not show this process.
pid_t SelfInProc() {
  char link[32];
  const ssize_t got = ::readlink("/proc/self", link, sizeof(link) - 1);
  if (got <= 0) return 0;
  ssize_t i = 0;
  const int64_t pid = ParseInt(link, got, &i);
  return pid > 0 && i == got ? static_cast<pid_t>(pid) : 0;
}
pid_t ParentInProc() {
  ProcRow row{};
  const pid_t self = SelfInProc();
  return self > 0 && ReadStat(self, &row) ? row.ppid : 0;
}

// Starts one of the guard's lines, in the daemon's own format
// (common/logging.h) written by hand: spdlog cannot be used in a child
// forked from a threaded process.
void PutLineStart(char* line, size_t* n, size_t cap, const char* job) {
  PutUtcNow(line, n, cap);
  PutStr(line, n, cap, " E [fence-guard] job=");
  PutStr(line, n, cap, job);
  PutStr(line, n, cap, " rank=");
}

// Kills every listing the guard has not killed yet (killed[i]: the sequence
// number it killed in slot i). Returns how many listings it took up.
int KillListed(FenceGuard::Slot* slots, uint32_t* killed, int64_t now, int64_t deadline) {
  int taken = 0;
  for (int i = 0; i < FenceGuard::kSlots; ++i) {
    FenceGuard::Slot& s = slots[i];
    const uint32_t seq = s.seq.load(std::memory_order_acquire);
    if ((seq & 1) != 0 || seq == killed[i]) continue;
    const int32_t pgid = s.pgid.load(std::memory_order_relaxed);
    const int32_t rank = s.rank.load(std::memory_order_relaxed);
    const int64_t round = s.round.load(std::memory_order_relaxed);
    char job[FenceGuard::kJobIdBytes + 1] = {};
    LoadText(s.job, FenceGuard::Slot::kJobWords, job);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) continue;  // rewritten meanwhile
    killed[i] = seq;
    if (pgid <= 0) continue;
    ++taken;
    // A worker that already died (its agent killed it at this very deadline
    // and has not reaped it yet) was not the guard's: its group's stragglers
    // go, unsaid.
    const bool leader_runs = Runs(pgid);
    // Stamped before the kill: the agent reaps the worker only after it
    // died, and must then find the stamp.
    if (leader_runs) {
      s.killed_ns.store(now, std::memory_order_relaxed);
      s.killed_for.store(seq, std::memory_order_release);
    }
    if (::kill(-pgid, SIGKILL) != 0) {
      if (leader_runs) s.killed_for.store(0, std::memory_order_release);  // gone meanwhile
      continue;
    }
    if (!leader_runs) continue;
    char line[512];
    size_t n = 0;
    const size_t cap = sizeof(line) - 1;
    PutLineStart(line, &n, cap, job);
    PutInt(line, &n, cap, rank);
    PutStr(line, &n, cap, " SIGKILLed process group ");
    PutInt(line, &n, cap, pgid);
    PutStr(line, &n, cap, " (round ");
    PutInt(line, &n, cap, round);
    PutStr(line, &n, cap, "), ");
    PutInt(line, &n, cap, (now - deadline) / 1000000);
    PutStr(line, &n, cap,
           " ms past the node's fence deadline: its agent has not renewed the lease with the "
           "coordinator in time (it is frozen or cut off), so the rank may be given to another "
           "node\n");
    line[n] = '\0';
    (void)!::write(2, line, n);
  }
  return taken;
}

// ------------------------------------- helpers a worker left outside its group
// A worker's descendant that left its process group (setsid, a double fork)
// is not in the group KillListed kills. Past the deadline the guard also
// kills every process in the agent's tree whose environment names this
// agent (LOCKSTEP_AGENT), as the agent's orphan sweep would once it runs
// again (daemon/orphans.h).

// What one sweep found.
struct SweepCount {
  int killed = 0;      // helpers SIGKILLed this sweep, not before
  int unreadable = 0;  // in the agent's tree, environment not readable yet
};

// Every process in /proc into rows[0..cap), sorted by pid; how many.
int ScanProcesses(ProcRow* rows, int cap) {
  const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  int n = 0;
  alignas(8) char buf[8192];
  while (n < cap) {
    const long got = ::syscall(SYS_getdents64, dir, buf, sizeof(buf));
    if (got <= 0) break;
    for (long off = 0; off < got && n < cap;) {
      // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
      uint16_t reclen;
      std::memcpy(&reclen, buf + off + 16, sizeof(reclen));
      const char* name = buf + off + 19;
      off += reclen;
      pid_t pid = 0;
      bool digits = name[0] != '\0';
      for (const char* c = name; *c != '\0'; ++c) {
        if (*c < '0' || *c > '9') {
          digits = false;
          break;
        }
        pid = pid * 10 + (*c - '0');
      }
      if (digits && ReadStat(pid, &rows[n])) ++n;
    }
  }
  ::close(dir);
  // /proc lists pids in ascending order; sorted anyway (a shell sort: no
  // allocation, no library call).
  for (int gap = n / 2; gap > 0; gap /= 2) {
    for (int i = gap; i < n; ++i) {
      const ProcRow r = rows[i];
      int j = i;
      for (; j >= gap && rows[j - gap].pid > r.pid; j -= gap) rows[j] = rows[j - gap];
      rows[j] = r;
    }
  }
  return n;
}

const ProcRow* FindRow(const ProcRow* rows, int n, pid_t pid) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (rows[mid].pid < pid) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && rows[lo].pid == pid ? &rows[lo] : nullptr;
}

// Whether `row`'s process descends from `ancestor` (an agent that is its
// pid namespace's init, as in a container, is pid 1). *unsure: an ancestor
// exited during the scan (the process is being adopted), so a later sweep
// must look again.
bool Descends(const ProcRow* rows, int n, const ProcRow& row, pid_t ancestor, bool* unsure) {
  pid_t p = row.ppid;
  for (int depth = 0; depth < 4096 && p > 0; ++depth) {
    if (p == ancestor) return true;
    if (p == 1) return false;
    const ProcRow* parent = FindRow(rows, n, p);
    if (parent == nullptr) {
      *unsure = true;
      return false;
    }
    p = parent->ppid;
  }
  return false;
}

// The values of a few variables of a process's environment, read as it
// streams by (the environment may be long): entries are NUL-terminated
// "NAME=value"; the first entry of a name counts, as for getenv.
class EnvFields {
 public:
  static constexpr int kFields = 4;
  static constexpr size_t kValueBytes = FenceGuard::kAgentBytes;
  enum Field { kAgent, kJob, kRank, kRound };

  EnvFields() {
    SetName(kAgent, worker_env::kAgent);
    SetName(kJob, worker_env::kJobId);
    SetName(kRank, worker_env::kRank);
    SetName(kRound, worker_env::kRound);
    StartEntry();
  }

  void Feed(const char* data, size_t len) {
    for (size_t k = 0; k < len; ++k) {
      const char c = data[k];
      if (c == '\0') {
        if (capturing_ >= 0) {
          fields_[capturing_].found = true;
          fields_[capturing_].value[fields_[capturing_].len] = '\0';
        }
        StartEntry();
        continue;
      }
      if (capturing_ >= 0) {
        Value& v = fields_[capturing_];
        if (v.len + 1 < kValueBytes) {
          v.value[v.len++] = c;
        } else {
          v.overflow = true;
        }
        continue;
      }
      if (capturing_ == kSkip) continue;
      int still = 0;
      for (int f = 0; f < kFields; ++f) {
        if ((candidates_ & (1 << f)) == 0) continue;
        if (pos_ < fields_[f].name_len && fields_[f].name[pos_] == c) {
          ++still;
          // The whole "NAME=" matched: the rest of the entry is the value.
          if (pos_ + 1 == fields_[f].name_len) {
            capturing_ = fields_[f].found ? kSkip : f;
            fields_[f].len = 0;
          }
        } else {
          candidates_ &= ~(1 << f);
        }
      }
      ++pos_;
      if (still == 0) capturing_ = kSkip;
    }
  }

  // The value of `f`, or nullptr when absent or too long to hold.
  const char* Get(Field f) const {
    const Value& v = fields_[f];
    return v.found && !v.overflow ? v.value : nullptr;
  }

 private:
  static constexpr int kSkip = -2;
  struct Value {
    char name[40] = {};  // "NAME="
    size_t name_len = 0;
    char value[kValueBytes] = {};
    size_t len = 0;
    bool found = false;
    bool overflow = false;
  };

  void SetName(Field f, const char* name) {
    size_t n = 0;
    PutStr(fields_[f].name, &n, sizeof(fields_[f].name) - 2, name);
    fields_[f].name[n++] = '=';
    fields_[f].name_len = n;
  }
  void StartEntry() {
    pos_ = 0;
    candidates_ = (1 << kFields) - 1;
    capturing_ = -1;
  }

  Value fields_[kFields];
  size_t pos_ = 0;
  int candidates_ = 0;
  int capturing_ = -1;
};

// Reads /proc/<pid>/environ; false when it cannot be read or reads empty (a
// process of another uid, one in the middle of an exec, one exiting).
bool ReadEnviron(pid_t pid, EnvFields* fields) {
  char path[64];
  ProcPath(path, pid, "environ");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  size_t total = 0;
  while (true) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got <= 0) break;
    fields->Feed(buf, static_cast<size_t>(got));
    total += static_cast<size_t>(got);
  }
  ::close(fd);
  return total > 0;
}

bool SameText(const char* a, const char* b) {
  if (a == nullptr || b == nullptr) return false;
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

// What the guard needs to sweep, set before the fork.
struct SweepSetup {
  pid_t agent = 0;                            // its tree is searched
  const FenceGuard::Marker* marker = nullptr;  // its LOCKSTEP_AGENT, its job uids
  ProcRow* rows = nullptr;                    // scratch, kMaxProcesses of them
  pid_t* killed = nullptr;                    // helpers killed this fence, kMaxKilled of them
};

// The agent's marker as it stands; false while the agent is writing it
// (an agent stopped in the middle of SetAgent must not hang the guard).
bool ReadMarker(const FenceGuard::Marker& m, char* out) {
  for (int tries = 0; tries < 8; ++tries) {
    const uint32_t seq = m.seq.load(std::memory_order_acquire);
    if ((seq & 1) == 0) {
      LoadText(m.text, FenceGuard::Marker::kWords, out);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (m.seq.load(std::memory_order_relaxed) == seq) {
        out[FenceGuard::kAgentBytes - 1] = '\0';
        return true;
      }
    }
    struct timespec pause = {0, 100000};
    ::nanosleep(&pause, nullptr);
  }
  return false;
}

// The uid a process runs as: the owner of /proc/<pid> (its effective uid
// while it is dumpable, as a worker that exec'd after its switch to a job
// uid is). Unlike its environment, readable without CAP_SYS_PTRACE.
bool OwnerOf(pid_t pid, uint32_t* uid) {
  char path[64];
  ProcPath(path, pid, "");
  struct stat st {};
  if (::stat(path, &st) != 0) return false;
  *uid = st.st_uid;
  return true;
}

constexpr int kMaxProcesses = 1 << 16;
constexpr int kMaxKilled = 1024;
constexpr size_t kRowBytes = sizeof(ProcRow) * kMaxProcesses;
constexpr size_t kScratchBytes = kRowBytes + sizeof(pid_t) * kMaxKilled;

// Kills the helpers in the agent's tree that are not in a listed worker's
// group (those went with it): those whose environment carries its marker,
// and, where an environment cannot be read (another uid's, without
// CAP_SYS_PTRACE, which the shipped units and the agent pod do not grant),
// those running as one of the node's job uids. Says so once per helper per
// fence (killed_n: how many are in setup.killed).
SweepCount SweepHelpers(const SweepSetup& setup, const FenceGuard::Slot* slots, int* killed_n,
                        int64_t now, int64_t deadline) {
  SweepCount count;
  char marker[FenceGuard::kAgentBytes];
  if (!ReadMarker(*setup.marker, marker)) {
    ++count.unreadable;  // look again
    return count;
  }
  const uint32_t uid_first = setup.marker->uid_first.load(std::memory_order_relaxed);
  const uint32_t uid_last = setup.marker->uid_last.load(std::memory_order_relaxed);
  if (marker[0] == '\0' && uid_first == 0) return count;
  const pid_t self = SelfInProc();
  const int n = ScanProcesses(setup.rows, kMaxProcesses);
  for (int i = 0; i < n; ++i) {
    const ProcRow& row = setup.rows[i];
    if (row.pid == self || row.pid == setup.agent || row.state == 'Z' || row.state == 'X') continue;
    bool unsure = false;
    if (!Descends(setup.rows, n, row, setup.agent, &unsure)) {
      if (unsure) ++count.unreadable;
      continue;
    }
    bool in_listed_group = false;
    for (int s = 0; s < FenceGuard::kSlots && !in_listed_group; ++s) {
      const int32_t pgid = slots[s].pgid.load(std::memory_order_relaxed);
      in_listed_group = pgid > 0 && pgid == row.pgid;
    }
    if (in_listed_group) continue;
    // A process in uninterruptible sleep may hold its memory map's lock,
    // which reading its environment waits for: only its owner is looked at.
    EnvFields env;
    const bool env_read = row.state != 'D' && ReadEnviron(row.pid, &env);
    uint32_t uid = 0;
    bool by_uid = false;
    if (env_read) {
      if (!SameText(env.Get(EnvFields::kAgent), marker)) continue;  // not this agent's worker's
    } else if (uid_first != 0 && OwnerOf(row.pid, &uid) && uid >= uid_first && uid <= uid_last) {
      by_uid = true;
    } else {
      ++count.unreadable;
      continue;
    }
    char comm[32];
    ProcRow now_row{};
    if (!ReadStat(row.pid, &now_row, comm, sizeof(comm))) continue;  // gone meanwhile
    const bool leader = row.pgid == row.pid;
    if (::kill(leader ? -row.pid : row.pid, SIGKILL) != 0) continue;
    bool said = false;
    for (int k = 0; k < *killed_n && !said; ++k) said = setup.killed[k] == row.pid;
    if (said) continue;  // still dying from an earlier sweep's kill
    ++count.killed;
    if (*killed_n < kMaxKilled) setup.killed[(*killed_n)++] = row.pid;
    auto or_unknown = [](const char* v) { return v != nullptr ? v : "?"; };
    char line[640];
    size_t k = 0;
    const size_t cap = sizeof(line) - 1;
    PutLineStart(line, &k, cap, by_uid ? "?" : or_unknown(env.Get(EnvFields::kJob)));
    PutStr(line, &k, cap, by_uid ? "?" : or_unknown(env.Get(EnvFields::kRank)));
    PutStr(line, &k, cap, " SIGKILLed pid ");
    PutInt(line, &k, cap, row.pid);
    PutStr(line, &k, cap, " (");
    PutStr(line, &k, cap, comm);
    PutStr(line, &k, cap, leader ? " and its process group" : "");
    if (by_uid) {
      PutStr(line, &k, cap, "), which ran as uid ");
      PutInt(line, &k, cap, uid);
      PutStr(line, &k, cap, ", a job uid of this node, outside its worker's process group, ");
    } else {
      PutStr(line, &k, cap, "), which round ");
      PutStr(line, &k, cap, or_unknown(env.Get(EnvFields::kRound)));
      PutStr(line, &k, cap, "'s workers started outside their process group (setsid or a "
                            "double fork), ");
    }
    PutInt(line, &k, cap, (now - deadline) / 1000000);
    PutStr(line, &k, cap, " ms past the node's fence deadline\n");
    line[k] = '\0';
    (void)!::write(2, line, k);
  }
  return count;
}

[[noreturn]] void GuardMain(const worker_link::FencePage* fence, FenceGuard::Slot* slots,
                            const SweepSetup& setup, int pipe_read) {
  // Its own process group: a stop sent to the daemon's group (a shell's
  // ^Z, kill -STOP -PGID) does not stop the guard.
  (void)::setpgid(0, 0);
  // Told from the daemon in ps and /proc/PID/comm.
  (void)::prctl(PR_SET_NAME, FenceGuard::kProcessName, 0, 0, 0);
  // Only the pipe and stdio stay open: the guard must not hold the
  // daemon's sockets, files or a launch's exec pipe.
  // (A kernel older than close_range, 5.9: one by one, as far as the
  // descriptor limit of a daemon that never raised it.)
  if (pipe_read > 3 && ::close_range(3, static_cast<unsigned>(pipe_read) - 1, 0) != 0) {
    for (int fd = 3; fd < pipe_read; ++fd) ::close(fd);
  }
  if (::close_range(static_cast<unsigned>(pipe_read) + 1, ~0U, 0) != 0) {
    for (int fd = pipe_read + 1; fd < 65536; ++fd) ::close(fd);
  }
  uint32_t killed[FenceGuard::kSlots] = {};
  // Sweeps for helpers: once when a deadline passes and after each kill of
  // listings, then on while the last sweep killed one (it may have forked
  // as it died) or was unsure of one (an environment not readable yet: an
  // exec under way; an ancestor exiting mid-scan), kSweeps at most (a
  // second): a process that will not die (uninterruptible sleep) or that
  // stays unreadable is not scanned for forever.
  constexpr int kSweeps = 20;
  int64_t swept_for = 0;
  bool sweep_again = false;
  int sweeps_left = 0;
  int helpers_killed = 0;
  while (true) {
    const int64_t deadline = fence->deadline();
    const int64_t now = worker_link::MonotonicNowNs();
    if (deadline != 0 && now > deadline + kAfterDeadlineNs) {
      const int taken = KillListed(slots, killed, now, deadline);
      if (deadline != swept_for) helpers_killed = 0;
      if (deadline != swept_for || taken > 0) {
        sweeps_left = kSweeps;
        sweep_again = true;
      }
      swept_for = deadline;
      if (sweep_again && sweeps_left > 0) {
        --sweeps_left;
        const SweepCount c = SweepHelpers(setup, slots, &helpers_killed, now, deadline);
        sweep_again = c.killed > 0 || c.unreadable > 0;
      }
    }
    pollfd p{pipe_read, POLLIN, 0};
    const int r = ::poll(&p, 1, kTickMs);
    if (r > 0) ::_exit(0);  // the agent closed its end, or died
  }
}

}  // namespace

// ------------------------------------------------------- the agent's side

StatusOr<std::unique_ptr<FenceGuard>> FenceGuard::Start(const worker_link::FencePage* fence) {
  std::unique_ptr<FenceGuard> guard(new FenceGuard());
  guard->fence_ = fence;
  void* mem = ::mmap(nullptr, kSharedBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("fence guard: mmap of its listings: ", std::strerror(errno)));
  }
  guard->slots_ = new (mem) Slot[kSlots];
  guard->marker_ = new (static_cast<char*>(mem) + kSlotBytes) Marker();
  // The sweep's scratch, the guard's own (private: copied at the fork, and
  // only touched there once a deadline passed).
  void* scratch = ::mmap(nullptr, kScratchBytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("fence guard: mmap of its scratch memory: ", std::strerror(errno)));
  }
  guard->scratch_ = scratch;
  RETURN_IF_ERROR(guard->Spawn());
  return guard;
}

Status FenceGuard::Spawn() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("fence guard: pipe: ", std::strerror(errno)));
  }
  // Above stdio (a daemon started with stdin closed gets 0 here), which the
  // guard keeps: it closes every descriptor above its pipe's read end.
  if (fds[0] <= 2) {
    const int moved = ::fcntl(fds[0], F_DUPFD_CLOEXEC, 3);
    if (moved >= 0) {
      ::close(fds[0]);
      fds[0] = moved;
    }
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::UnavailableError(absl::StrCat("fence guard: fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    ::close(fds[1]);
    SweepSetup setup;
    setup.agent = ParentInProc();
    setup.marker = marker_;
    setup.rows = static_cast<ProcRow*>(scratch_);
    setup.killed = reinterpret_cast<pid_t*>(static_cast<char*>(scratch_) + kRowBytes);
    GuardMain(fence_, slots_, setup, fds[0]);
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first
  ::close(fds[0]);
  pid_ = pid;
  pipe_write_ = fds[1];
  return absl::OkStatus();
}

std::optional<std::string> FenceGuard::Ended() {
  if (pid_ <= 0) return std::string("not started");
  int st = 0;
  const pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == 0) return std::nullopt;
  std::string how = r < 0 ? absl::StrCat("lost: ", std::strerror(errno))
                    : WIFSIGNALED(st) ? absl::StrCat("killed by signal ", WTERMSIG(st))
                                      : absl::StrCat("exited with code ", WEXITSTATUS(st));
  pid_ = -1;
  ::close(pipe_write_);
  pipe_write_ = -1;
  return how;
}

Status FenceGuard::Restart() {
  if (pid_ > 0) return absl::FailedPreconditionError("fence guard: still running");
  return Spawn();
}

FenceGuard::~FenceGuard() {
  if (pipe_write_ >= 0) ::close(pipe_write_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  if (slots_ != nullptr) ::munmap(slots_, kSharedBytes);
  if (scratch_ != nullptr) ::munmap(scratch_, kScratchBytes);
}

FenceGuard::Entry FenceGuard::Watch(pid_t pgid, absl::string_view job_id, int rank,
                                    int64_t round) {
  Entry entry;
  MutexLock lock(&mu_);
  for (int tried = 0; tried < kSlots; ++tried) {
    const int i = (next_ + tried) % kSlots;
    Slot& s = slots_[i];
    if (s.pgid.load(std::memory_order_relaxed) != 0) continue;
    next_ = (i + 1) % kSlots;
    entry.seq_ = WriteUnderSeq(s.seq, [&] {
      s.pgid.store(static_cast<int32_t>(pgid), std::memory_order_relaxed);
      s.rank.store(rank, std::memory_order_relaxed);
      s.round.store(round, std::memory_order_relaxed);
      StoreText(s.job, Slot::kJobWords, job_id);
    });
    entry.guard_ = this;
    entry.slot_ = i;
    return entry;
  }
  return entry;  // every slot taken: not guarded
}

void FenceGuard::SetAgent(absl::string_view agent) {
  MutexLock lock(&mu_);
  WriteUnderSeq(marker_->seq, [&] { StoreText(marker_->text, Marker::kWords, agent); });
}

void FenceGuard::SetJobUids(uint32_t first, uint32_t last) {
  marker_->uid_first.store(first, std::memory_order_relaxed);
  marker_->uid_last.store(last, std::memory_order_relaxed);
}

void FenceGuard::Release(int slot, uint32_t seq) {
  MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  if (s.seq.load(std::memory_order_relaxed) != seq) return;
  WriteUnderSeq(s.seq, [&] { s.pgid.store(0, std::memory_order_relaxed); });
}

FenceGuard::Entry& FenceGuard::Entry::operator=(Entry&& other) noexcept {
  if (this != &other) {
    Forget();
    guard_ = other.guard_;
    slot_ = other.slot_;
    seq_ = other.seq_;
    other.guard_ = nullptr;
  }
  return *this;
}

int64_t FenceGuard::Entry::KilledNs() const {
  if (guard_ == nullptr) return 0;
  const Slot& s = guard_->slots_[slot_];
  if (s.killed_for.load(std::memory_order_acquire) != seq_) return 0;
  return s.killed_ns.load(std::memory_order_relaxed);
}

void FenceGuard::Entry::Forget() {
  if (guard_ == nullptr) return;
  guard_->Release(slot_, seq_);
  guard_ = nullptr;
}

}  // namespace daemon
}  // namespace lockstep
