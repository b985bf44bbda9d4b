#include "ddp/shm_communicator.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/worker_link.h"
#include "ddp/missing_ranks.h"

namespace lockstep {
namespace ddp {
namespace {

constexpr uint64_t kMagic = 0x4d53504554534b4cULL;  // "LKSTEPSM", little-endian.
constexpr size_t kLine = 64;
constexpr size_t kSlotAlign = 128;  // Each half of a slot stays 64-byte aligned.

struct Header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t slot_bytes;
  uint32_t world;
  // Bumped by every arrival; waiters sleep on it with futex(2) (a shared,
  // not process-private, futex: the ranks are separate processes).
  std::atomic<uint32_t> generation;
  std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(Header) <= kLine, "the header fits in its line");

// One per rank, each on its own cache line so that ranks publishing their
// phase do not invalidate each other's lines.
struct alignas(kLine) Control {
  std::atomic<uint64_t> phase;
  std::atomic<int64_t> pid;
  std::atomic<uint32_t> attached;
};
static_assert(sizeof(Control) == kLine, "one control line per rank");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "atomics shared between processes");

size_t SlotsOffset(int world) { return kLine + kLine * static_cast<size_t>(world); }
size_t SegmentBytes(int world, size_t slot_bytes) {
  return SlotsOffset(world) + slot_bytes * static_cast<size_t>(world);
}

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

std::string LocalHostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// The process is gone, or is a zombie nobody has reaped yet (kill() still
// succeeds on those).
bool ProcessExited(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');  // The name may hold spaces.
  if (close_paren == nullptr || close_paren[1] != ' ') return false;
  return close_paren[2] == 'Z' || close_paren[2] == 'X';
}

// Sleeps until *word != seen, a wake, or `timeout`.
void FutexWait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::microseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000;
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  (void)syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr,
                nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct ShmCommunicator::Segment {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  int fd = -1;            // Rank 0: the memfd, open until every rank attached.
  std::string where;      // "/proc/<pid>/fd/<fd>" of rank 0's memfd, for messages.
  std::vector<char> check_pid;  // Per rank: its pid is visible from here.

  Header* header() const { return reinterpret_cast<Header*>(base); }
  Control* control(int rank) const {
    return reinterpret_cast<Control*>(base + kLine + kLine * static_cast<size_t>(rank));
  }
  uint8_t* slot(int rank, size_t slot_bytes) const {
    return base + SlotsOffset(static_cast<int>(header()->world)) +
           slot_bytes * static_cast<size_t>(rank);
  }
  void CloseFd() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~Segment() {
    CloseFd();
    if (base != nullptr) (void)munmap(base, bytes);
  }
};

StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Create(rendezvous::Store* store,
                                                                  int rank, int world_size,
                                                                  ShmOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("shm: store is null");
  RETURN_IF_ERROR(CheckRank("shm", rank, world_size));
  if (options.slot_bytes < kSlotAlign) {
    return absl::InvalidArgumentError(absl::StrCat("shm: slot_bytes must be at least ",
                                                   kSlotAlign, ", got ", options.slot_bytes));
  }
  options.slot_bytes = (options.slot_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  const std::string host = options.hostname.empty() ? LocalHostname() : options.hostname;
  const std::string& prefix = options.key_prefix;
  const std::string who = absl::StrCat("shm: rank ", rank);
  RETURN_IF_ERROR(Annotate(store->Set(absl::StrCat(prefix, "/host/", rank), host),
                           who + ": publishing its host"));
  const MonoTime deadline = RealClock()->Now() + options.connect_timeout;
  const size_t bytes = SegmentBytes(world_size, options.slot_bytes);

  auto segment = std::make_unique<Segment>();
  int fd = -1;
  uint64_t nonce = 0;
  if (rank == 0) {
    std::random_device random;
    nonce = (uint64_t{random()} << 32) ^ random();
    // An anonymous memfd: it has no name in /dev/shm, so nothing is left
    // behind whenever the processes stop. The others open it through
    // /proc/<pid>/fd/<fd> while rank 0 holds it open.
    fd = static_cast<int>(syscall(SYS_memfd_create, "lockstep-shm", MFD_CLOEXEC));
    if (fd < 0) return absl::InternalError(Errno(who + ": memfd_create"));
    segment->fd = fd;
    segment->where = absl::StrFormat("/proc/%d/fd/%d", getpid(), fd);
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      return absl::InternalError(Errno(absl::StrCat(who, ": sizing the segment to ", bytes,
                                                    " bytes (is shared memory limited?)")));
    }
  } else {
    const std::string what = absl::StrCat(who, " waiting for rank 0's shared-memory segment");
    RETURN_IF_ERROR(WaitForRanks(store, {{0, prefix + "/segment"}}, options.connect_timeout, what,
                                 options.progress));
    auto published = store->Get(prefix + "/segment", std::chrono::seconds(5));
    if (!published.ok()) return Annotate(published.status(), who + ": reading rank 0's segment");
    auto host0 = store->Get(prefix + "/host/0", std::chrono::seconds(5));
    if (!host0.ok()) return Annotate(host0.status(), who + ": reading rank 0's host");
    if (*host0 != host) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " is on host '", host, "' but rank 0 is on '", *host0,
                       "': the shm backend needs every rank on one host (use gloo)"));
    }
    int pid0 = 0, fd0 = -1;
    unsigned long long published_nonce = 0;
    if (std::sscanf(published->c_str(), "%d:%d:%llx", &pid0, &fd0, &published_nonce) != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": rank 0 published '", *published, "' as its segment (want pid:fd:nonce)"));
    }
    nonce = published_nonce;
    segment->where = absl::StrFormat("/proc/%d/fd/%d", pid0, fd0);
    fd = open(segment->where.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      return absl::FailedPreconditionError(Errno(absl::StrCat(
          who, ": opening rank 0's segment ", segment->where,
          " (rank 0 gone, or not in this pid namespace with this user: the shm backend needs "
          "every rank of a host started alike, as lockstepd does)")));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": segment ", segment->where, " has ", static_cast<int64_t>(st.st_size),
          " bytes, expected ", bytes, " (do all ranks use the same world size and slot_bytes?)"));
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const std::string map_error = base == MAP_FAILED ? Errno(who + ": mmap") : std::string();
  if (rank != 0) close(fd);
  if (base == MAP_FAILED) return absl::InternalError(map_error);
  segment->base = static_cast<uint8_t*>(base);
  segment->bytes = bytes;

  if (rank == 0) {
    Header* h = segment->header();
    h->magic = kMagic;
    h->nonce = nonce;
    h->slot_bytes = options.slot_bytes;
    h->world = static_cast<uint32_t>(world_size);
    new (&h->generation) std::atomic<uint32_t>(0);
    new (&h->sleepers) std::atomic<uint32_t>(0);
    for (int r = 0; r < world_size; ++r) {
      Control* c = new (segment->control(r)) Control;
      c->phase.store(0, std::memory_order_relaxed);
      c->pid.store(0, std::memory_order_relaxed);
      c->attached.store(0, std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_release);
    RETURN_IF_ERROR(Annotate(
        store->Set(prefix + "/segment",
                   absl::StrFormat("%d:%d:%016x", getpid(), segment->fd, nonce)),
        who + ": publishing the segment"));
  } else {
    std::atomic_thread_fence(std::memory_order_acquire);
    const Header* h = segment->header();
    if (h->magic != kMagic || h->nonce != nonce) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": ", segment->where, " is not the segment rank 0 published for this job round"));
    }
    if (h->world != static_cast<uint32_t>(world_size) || h->slot_bytes != options.slot_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": segment ", segment->where, " was made for ", h->world, " ranks of ",
          h->slot_bytes, " bytes; this rank expects ", world_size, " of ", options.slot_bytes));
    }
  }
  Control* mine = segment->control(rank);
  mine->pid.store(getpid(), std::memory_order_relaxed);
  mine->attached.store(1, std::memory_order_release);

  // Everyone attached (then rank 0 closes the memfd), or name who did not.
  std::vector<int> missing;
  const MonoTime start = RealClock()->Now();
  MonoTime next_progress = start + kBootstrapProgressInterval;
  while (true) {
    missing.clear();
    for (int r = 0; r < world_size; ++r) {
      if (segment->control(r)->attached.load(std::memory_order_acquire) == 0) missing.push_back(r);
    }
    const MonoTime now = RealClock()->Now();
    if (missing.empty() || now > deadline) break;
    if (now >= next_progress && options.progress) {
      options.progress(absl::StrCat(who, " attaching the shared-memory segment: still waiting for ranks ",
                                    FormatRanks(missing), " (",
                                    static_cast<int64_t>(ToSeconds(now - start)), " s of ",
                                    ToSeconds(options.connect_timeout), " s)"));
      next_progress = now + kBootstrapProgressInterval;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  segment->CloseFd();
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat(who, ": ranks ", FormatRanks(missing), " never attached to the segment within ",
                     ToSeconds(options.connect_timeout), " s"));
  }
  // A peer in another pid namespace (a container sharing /dev/shm) has a pid
  // we cannot see: only the timeout can catch its death.
  segment->check_pid.assign(world_size, 0);
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = static_cast<pid_t>(segment->control(r)->pid.load(std::memory_order_relaxed));
    segment->check_pid[r] = pid > 0 && (kill(pid, 0) == 0 || errno == EPERM) ? 1 : 0;
  }
  return std::unique_ptr<ShmCommunicator>(
      new ShmCommunicator(rank, world_size, std::move(options), std::move(segment)));
}

ShmCommunicator::ShmCommunicator(int rank, int world_size, ShmOptions options,
                                 std::unique_ptr<Segment> segment)
    : rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      segment_(std::move(segment)) {}

ShmCommunicator::~ShmCommunicator() = default;

std::shared_ptr<Work> ShmCommunicator::Enqueue(
    const char* name, std::function<Status(uint64_t seq, MonoTime deadline)> body) {
  return queue_.Enqueue(name, [this, body = std::move(body)](uint64_t seq) {
    return body(seq, RealClock()->Now() + options_.timeout);
  });
}

Status ShmCommunicator::Arrive(uint64_t seq, const char* name, MonoTime deadline) {
  Header* header = segment_->header();
  const uint64_t target = ++phase_;
  segment_->control(rank_)->phase.store(target, std::memory_order_seq_cst);
  header->generation.fetch_add(1, std::memory_order_seq_cst);
  if (header->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&header->generation);
  auto all_arrived = [&] {
    for (int r = 0; r < world_size_; ++r) {
      if (segment_->control(r)->phase.load(std::memory_order_acquire) < target) return false;
    }
    return true;
  };
  // A short spin covers peers that are a few microseconds behind.
  for (int i = 0; i < 256; ++i) {
    if (all_arrived()) return absl::OkStatus();
    CpuRelax();
  }
  MonoTime next_pid_check{};
  while (true) {
    const uint32_t seen = header->generation.load(std::memory_order_seq_cst);
    if (all_arrived()) return absl::OkStatus();
    // Check the deadline, and every 10 ms the peers' processes.
    const MonoTime now = RealClock()->Now();
    const bool check_pids = now >= next_pid_check;
    if (check_pids) next_pid_check = now + std::chrono::milliseconds(10);
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (segment_->control(r)->phase.load(std::memory_order_acquire) >= target) continue;
      missing.push_back(r);
      const auto pid = static_cast<pid_t>(segment_->control(r)->pid.load(std::memory_order_relaxed));
      if (check_pids && segment_->check_pid[r] && ProcessExited(pid)) {
        worker_link::MarkPeerLost();  // this rank follows r's failure
        return absl::UnavailableError(absl::StrCat("shm ", name, " #", seq, " on rank ", rank_,
                                                   ": rank ", r, " (pid ", pid, ") exited"));
      }
    }
    if (now > deadline) {
      worker_link::MarkPeerLost();
      return absl::DeadlineExceededError(
          absl::StrCat("shm ", name, " #", seq, " on rank ", rank_, ": ranks ",
                       FormatRanks(missing), " did not arrive within ",
                       ToSeconds(options_.timeout), " s"));
    }
    // Sleep until the next arrival anywhere (or 10 ms, for the checks above).
    // An arrival between `seen` and the wait changes the word, so the wait
    // returns at once: no wake-up is lost.
    header->sleepers.fetch_add(1, std::memory_order_seq_cst);
    FutexWait(&header->generation, seen, std::chrono::milliseconds(10));
    header->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

size_t ShmCommunicator::NextHalf() { return chunks_++ % 2; }

uint8_t* ShmCommunicator::HalfOf(int rank, size_t half) const {
  return segment_->slot(rank, options_.slot_bytes) + half * (options_.slot_bytes / 2);
}

Status ShmCommunicator::RunAllReduce(const at::Tensor& tensor, ReduceOp op, uint64_t seq,
                                     MonoTime deadline) {
  const int64_t es = static_cast<int64_t>(tensor.element_size());
  const int64_t numel = tensor.numel();
  const int64_t chunk = static_cast<int64_t>(options_.slot_bytes / 2) / es;
  auto* data = static_cast<uint8_t*>(tensor.data_ptr());
  const auto dtype = at::TensorOptions().dtype(tensor.scalar_type());
  const int64_t world = world_size_;
  for (int64_t off = 0; off < numel; off += chunk) {
    const int64_t n = std::min(chunk, numel - off);
    const size_t half = NextHalf();
    std::memcpy(HalfOf(rank_, half), data + off * es, static_cast<size_t>(n * es));
    RETURN_IF_ERROR(Arrive(seq, "allreduce", deadline));
    // This rank reduces [lo, hi) of the chunk, in place in its own slot.
    const int64_t lo = n * rank_ / world, hi = n * (rank_ + 1) / world;
    if (hi > lo) {
      at::Tensor acc = at::from_blob(HalfOf(rank_, half) + lo * es, {hi - lo}, dtype);
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_) acc.add_(at::from_blob(HalfOf(r, half) + lo * es, {hi - lo}, dtype));
      }
      if (op == ReduceOp::kAvg) acc.div_(world);
    }
    RETURN_IF_ERROR(Arrive(seq, "allreduce", deadline));
    for (int r = 0; r < world_size_; ++r) {
      const int64_t rlo = n * r / world, rhi = n * (r + 1) / world;
      std::memcpy(data + (off + rlo) * es, HalfOf(r, half) + rlo * es,
                  static_cast<size_t>((rhi - rlo) * es));
    }
  }
  return absl::OkStatus();
}

Status ShmCommunicator::RunBroadcast(const at::Tensor& tensor, int root, uint64_t seq,
                                     MonoTime deadline) {
  const size_t bytes = tensor.nbytes();
  const size_t chunk = options_.slot_bytes / 2;
  auto* data = static_cast<uint8_t*>(tensor.data_ptr());
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    const size_t half = NextHalf();
    if (rank_ == root) std::memcpy(HalfOf(root, half), data + off, n);
    RETURN_IF_ERROR(Arrive(seq, "broadcast", deadline));
    if (rank_ != root) std::memcpy(data + off, HalfOf(root, half), n);
  }
  return absl::OkStatus();
}

Status ShmCommunicator::RunAllGather(const at::Tensor& input, const at::Tensor& output,
                                     uint64_t seq, MonoTime deadline) {
  const size_t bytes = input.nbytes();
  const size_t chunk = options_.slot_bytes / 2;
  const auto* in = static_cast<const uint8_t*>(input.data_ptr());
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    const size_t half = NextHalf();
    std::memcpy(HalfOf(rank_, half), in + off, n);
    RETURN_IF_ERROR(Arrive(seq, "allgather", deadline));
    for (int r = 0; r < world_size_; ++r) {
      std::memcpy(out + static_cast<size_t>(r) * bytes + off, HalfOf(r, half), n);
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> ShmCommunicator::AllReduce(at::Tensor tensor, ReduceOp op) {
  if (Status s = CheckCpuAllReduce(tensor, op); !s.ok()) return Work::Failed(s);
  return Enqueue("allreduce", [this, tensor, op](uint64_t seq, MonoTime deadline) {
    if (tensor.numel() == 0 || world_size_ == 1) return absl::OkStatus();
    return RunAllReduce(tensor, op, seq, deadline);
  });
}

std::shared_ptr<Work> ShmCommunicator::Broadcast(at::Tensor tensor, int root) {
  Status s = CheckCollectiveTensor(tensor, "broadcast");
  if (s.ok()) s = CheckBroadcastRoot(root, world_size_);
  if (!s.ok()) return Work::Failed(s);
  return Enqueue("broadcast", [this, tensor, root](uint64_t seq, MonoTime deadline) {
    if (tensor.numel() == 0 || world_size_ == 1) return absl::OkStatus();
    return RunBroadcast(tensor, root, seq, deadline);
  });
}

std::shared_ptr<Work> ShmCommunicator::AllGather(at::Tensor input, at::Tensor output) {
  if (Status s = CheckAllGather(input, output, world_size_); !s.ok()) return Work::Failed(s);
  return Enqueue("allgather", [this, input, output](uint64_t seq, MonoTime deadline) {
    if (input.numel() == 0) return absl::OkStatus();
    if (world_size_ == 1) {
      std::memcpy(output.data_ptr(), input.data_ptr(), input.nbytes());
      return absl::OkStatus();
    }
    return RunAllGather(input, output, seq, deadline);
  });
}

std::shared_ptr<Work> ShmCommunicator::Barrier() {
  return Enqueue("barrier", [this](uint64_t seq, MonoTime deadline) {
    if (world_size_ == 1) return absl::OkStatus();
    return Arrive(seq, "barrier", deadline);
  });
}

}  // namespace ddp
}  // namespace lockstep
