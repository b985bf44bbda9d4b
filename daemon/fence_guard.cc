#include "daemon/fence_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

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

namespace {

constexpr size_t kSlotBytes = sizeof(FenceGuard::Slot) * FenceGuard::kSlots;
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

// Whether process `pid` runs: not gone, and not a zombie its parent has not
// reaped yet (a worker the agent itself killed a moment ago).
bool Runs(pid_t pid) {
  char path[40];
  size_t n = 0;
  PutStr(path, &n, sizeof(path) - 1, "/proc/");
  PutInt(path, &n, sizeof(path) - 1, pid);
  PutStr(path, &n, sizeof(path) - 1, "/stat");
  path[n] = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t got = ::read(fd, stat, sizeof(stat));
  ::close(fd);
  if (got <= 0) return false;
  // "pid (comm) S ...": the state follows the last ')'.
  for (ssize_t i = got - 1; i >= 0; --i) {
    if (stat[i] == ')') return i + 2 < got && stat[i + 2] != 'Z' && stat[i + 2] != 'X';
  }
  return true;
}

// Kills every listing the guard has not killed yet (killed[i]: the sequence
// number it killed in slot i).
void KillListed(FenceGuard::Slot* slots, uint32_t* killed, int64_t now, int64_t deadline) {
  for (int i = 0; i < FenceGuard::kSlots; ++i) {
    FenceGuard::Slot& s = slots[i];
    const uint32_t seq = s.seq.load(std::memory_order_acquire);
    if ((seq & 1) != 0 || seq == killed[i]) continue;
    const int32_t pgid = s.pgid.load(std::memory_order_relaxed);
    const int32_t rank = s.rank.load(std::memory_order_relaxed);
    const int64_t round = s.round.load(std::memory_order_relaxed);
    char job[FenceGuard::kJobIdBytes + 1] = {};
    for (int w = 0; w < FenceGuard::Slot::kJobWords; ++w) {
      const uint64_t word = s.job[w].load(std::memory_order_relaxed);
      std::memcpy(job + 8 * w, &word, 8);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) continue;  // rewritten meanwhile
    killed[i] = seq;
    if (pgid <= 0) continue;
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
    // The daemon's own line format (common/logging.h), written by hand:
    // spdlog cannot be used in a child forked from a threaded process.
    PutUtcNow(line, &n, cap);
    PutStr(line, &n, cap, " E [fence-guard] job=");
    PutStr(line, &n, cap, job);
    PutStr(line, &n, cap, " rank=");
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
}

[[noreturn]] void GuardMain(const worker_link::FencePage* fence, FenceGuard::Slot* slots,
                            int pipe_read) {
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
  while (true) {
    const int64_t deadline = fence->deadline();
    const int64_t now = worker_link::MonotonicNowNs();
    if (deadline != 0 && now > deadline + kAfterDeadlineNs) {
      KillListed(slots, killed, now, deadline);
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
  void* mem = ::mmap(nullptr, kSlotBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("fence guard: mmap of its listings: ", std::strerror(errno)));
  }
  guard->slots_ = new (mem) Slot[kSlots];
  RETURN_IF_ERROR(guard->Spawn());
  return guard;
}

Status FenceGuard::Spawn() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("fence guard: pipe: ", std::strerror(errno)));
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
    GuardMain(fence_, slots_, fds[0]);
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
  if (slots_ != nullptr) ::munmap(slots_, kSlotBytes);
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
    const uint32_t seq = s.seq.load(std::memory_order_relaxed);
    s.seq.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.pgid.store(static_cast<int32_t>(pgid), std::memory_order_relaxed);
    s.rank.store(rank, std::memory_order_relaxed);
    s.round.store(round, std::memory_order_relaxed);
    char job[kJobIdBytes] = {};
    std::memcpy(job, job_id.data(), std::min<size_t>(job_id.size(), kJobIdBytes - 1));
    for (int w = 0; w < Slot::kJobWords; ++w) {
      uint64_t word;
      std::memcpy(&word, job + 8 * w, 8);
      s.job[w].store(word, std::memory_order_relaxed);
    }
    s.seq.store(seq + 2, std::memory_order_release);
    entry.guard_ = this;
    entry.slot_ = i;
    entry.seq_ = seq + 2;
    return entry;
  }
  return entry;  // every slot taken: not guarded
}

void FenceGuard::Release(int slot, uint32_t seq) {
  MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  if (s.seq.load(std::memory_order_relaxed) != seq) return;
  s.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.pgid.store(0, std::memory_order_relaxed);
  s.seq.store(seq + 2, std::memory_order_release);
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
