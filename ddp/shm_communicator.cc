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
#include "common/unique_fd.h"
#include "common/worker_link.h"
#include "ddp/missing_ranks.h"
#include "ddp/streaming.h"

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
  // Set once this rank gave up a collective (its phase may already have
  // been counted): a peer that arrives later fails instead of passing the
  // barrier and writing into a buffer its owner no longer waits on.
  // 0: no; 1: blaming no rank; 2 + r: blaming rank r (this communicator's
  // numbering), whom a later peer marks too.
  std::atomic<uint32_t> gave_up;
  // Where this rank's current allreduce tensor is, published before its
  // first barrier: dtype << 8 | op; the bucket-memory region (0: ordinary
  // memory), the offset in this rank's buffer there, and the size in bytes.
  std::atomic<uint32_t> kind;
  std::atomic<uint64_t> region;
  std::atomic<uint64_t> offset;
  std::atomic<uint64_t> nbytes;
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

// Rank 0 writes a mapping's header before publishing it; the others check
// it is the mapping rank 0 published (pid and fd numbers can be reused).
void WriteHeader(uint8_t* base, uint64_t nonce, size_t bytes_per_rank, int world) {
  auto* h = reinterpret_cast<Header*>(base);
  h->magic = kMagic;
  h->nonce = nonce;
  h->slot_bytes = bytes_per_rank;
  h->world = static_cast<uint32_t>(world);
  std::atomic_thread_fence(std::memory_order_release);
}
bool IsPublishedHeader(const uint8_t* base, uint64_t nonce) {
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto* h = reinterpret_cast<const Header*>(base);
  return h->magic == kMagic && h->nonce == nonce;
}

uint64_t RandomNonce() {
  std::random_device random;
  return (uint64_t{random()} << 32) ^ random();
}

// Rank 0's side of sharing memory: an anonymous memfd (no name in /dev/shm,
// so nothing is left behind whenever the processes stop) of `bytes`. The
// others open it through /proc/<pid>/fd/<fd> while rank 0 holds it open.
StatusOr<UniqueFd> MakeMemfd(const std::string& who, size_t bytes) {
  UniqueFd fd(static_cast<int>(syscall(SYS_memfd_create, "lockstep-shm", MFD_CLOEXEC)));
  if (!fd.valid()) return absl::InternalError(Errno(who + ": memfd_create"));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::InternalError(Errno(absl::StrCat(who, ": sizing shared memory to ", bytes,
                                                  " bytes (is shared memory limited?)")));
  }
  return fd;
}

// What rank 0 publishes for a memfd: "<pid>:<fd>:<nonce>".
std::string PublishedMemfd(int fd, uint64_t nonce) {
  return absl::StrFormat("%d:%d:%016x", getpid(), fd, nonce);
}

// The others' side: opens the memfd rank 0 published as `published` (see
// PublishedMemfd) and checks it has `bytes`: a header and `world` x
// `per_rank` bytes. `what` names it in errors ("segment", "region 2");
// `*where` gets its /proc path, `*nonce` the nonce to check in its header.
StatusOr<UniqueFd> OpenPublishedMemfd(const std::string& who, const std::string& what,
                                      const std::string& published, size_t bytes, int world,
                                      size_t per_rank, std::string* where, uint64_t* nonce) {
  int pid0 = 0, fd0 = -1;
  unsigned long long published_nonce = 0;
  if (std::sscanf(published.c_str(), "%d:%d:%llx", &pid0, &fd0, &published_nonce) != 3) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": rank 0 published '", published,
                                                   "' as its ", what, " (want pid:fd:nonce)"));
  }
  *nonce = published_nonce;
  *where = absl::StrFormat("/proc/%d/fd/%d", pid0, fd0);
  UniqueFd fd(open(where->c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(Errno(absl::StrCat(
        who, ": opening rank 0's ", what, " ", *where,
        " (rank 0 gone, or not in this pid namespace with this user: the shm backend needs "
        "every rank of a host started alike, as lockstepd does)")));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    // What rank 0 made it for, from the header it wrote before publishing.
    std::string made;
    alignas(Header) unsigned char raw[sizeof(Header)];
    if (pread(fd.get(), raw, sizeof(raw), 0) == static_cast<ssize_t>(sizeof(raw))) {
      const auto* h = reinterpret_cast<const Header*>(raw);
      if (h->magic == kMagic && h->nonce == published_nonce) {
        made = absl::StrCat(": rank 0 made it for ", h->world, " ranks of ", h->slot_bytes,
                            " bytes each, this rank expects ", world, " of ", per_rank);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": ", what, " ", *where, " has ", static_cast<int64_t>(st.st_size),
        " bytes, expected ", bytes, made,
        " (do all ranks use the same world size and sizes?)"));
  }
  return fd;
}

std::string Placement(uint32_t kind, uint64_t region, uint64_t offset, uint64_t nbytes) {
  const auto dtype = static_cast<at::ScalarType>(kind >> 8);
  const char* op = (kind & 0xff) == static_cast<uint32_t>(ReduceOp::kAvg) ? "avg" : "sum";
  const std::string where =
      region == 0 ? std::string("ordinary memory")
                  : absl::StrCat("bucket region ", region, " at offset ", offset);
  return absl::StrCat(nbytes, " bytes of ", c10::toString(dtype), " (", op, ") in ", where);
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

struct ShmCommunicator::Region {
  uint64_t id = 0;           // 1, 2, ...: its allocation, the same on every rank.
  uint8_t* base = nullptr;   // A header line, then one buffer per rank.
  size_t map_bytes = 0;
  size_t buffer_bytes = 0;   // Per rank; a multiple of the page size.

  uint8_t* buffer(int rank) const {
    return base + kLine + buffer_bytes * static_cast<size_t>(rank);
  }
  ~Region() {
    if (base != nullptr) (void)munmap(base, map_bytes);
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
  UniqueFd opened;  // The others' fd on rank 0's memfd, until mapped.
  if (rank == 0) {
    nonce = RandomNonce();
    ASSIGN_OR_RETURN(UniqueFd made, MakeMemfd(who + " (segment)", bytes));
    fd = segment->fd = made.release();  // The Segment closes it.
    segment->where = absl::StrFormat("/proc/%d/fd/%d", getpid(), fd);
  } else {
    const std::string what = absl::StrCat(who, " waiting for rank 0's shared-memory segment");
    RETURN_IF_ERROR(WaitForRanks(store, {{0, prefix + "/segment"}}, options.connect_timeout, what,
                                 options.progress, kBootstrapProgressInterval,
                                 options.global_ranks));
    auto published = store->Get(prefix + "/segment", std::chrono::seconds(5));
    if (!published.ok()) return Annotate(published.status(), who + ": reading rank 0's segment");
    auto host0 = store->Get(prefix + "/host/0", std::chrono::seconds(5));
    if (!host0.ok()) return Annotate(host0.status(), who + ": reading rank 0's host");
    if (*host0 != host) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, " is on host '", host, "' but rank 0 is on '", *host0,
                       "': the shm backend needs every rank on one host (use gloo)"));
    }
    ASSIGN_OR_RETURN(opened, OpenPublishedMemfd(who, "segment", *published, bytes, world_size,
                                                options.slot_bytes, &segment->where, &nonce));
    fd = opened.get();
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::InternalError(Errno(who + ": mmap"));
  opened.Reset();
  segment->base = static_cast<uint8_t*>(base);
  segment->bytes = bytes;

  if (rank == 0) {
    Header* h = segment->header();
    new (&h->generation) std::atomic<uint32_t>(0);
    new (&h->sleepers) std::atomic<uint32_t>(0);
    for (int r = 0; r < world_size; ++r) {
      Control* c = new (segment->control(r)) Control;
      c->phase.store(0, std::memory_order_relaxed);
      c->pid.store(0, std::memory_order_relaxed);
      c->attached.store(0, std::memory_order_relaxed);
      c->gave_up.store(0, std::memory_order_relaxed);
    }
    WriteHeader(segment->base, nonce, options.slot_bytes, world_size);
    RETURN_IF_ERROR(Annotate(store->Set(prefix + "/segment", PublishedMemfd(segment->fd, nonce)),
                             who + ": publishing the segment"));
  } else {
    const Header* h = segment->header();
    if (!IsPublishedHeader(segment->base, nonce)) {
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
    MarkPeerLost(options.global_ranks, missing.front());  // they never came: theirs is the failure
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
      new ShmCommunicator(store, rank, world_size, std::move(options), std::move(segment)));
}

ShmCommunicator::ShmCommunicator(rendezvous::Store* store, int rank, int world_size,
                                 ShmOptions options, std::unique_ptr<Segment> segment)
    : store_(store),
      rank_(rank),
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
  int blamed = -1;
  Status s = WaitForAll(seq, name, deadline, &blamed);
  if (s.ok()) {
    // Every rank's phase is counted, but one may have given up meanwhile.
    for (int r = 0; r < world_size_; ++r) {
      const uint32_t gave_up =
          r == rank_ ? 0 : segment_->control(r)->gave_up.load(std::memory_order_acquire);
      if (gave_up == 0) continue;
      const int theirs = gave_up >= 2 ? static_cast<int>(gave_up) - 2 : -1;
      const std::string head =
          absl::StrCat("shm ", name, " #", seq, " on rank ", rank_, ": rank ", r,
                       " gave up on it first");
      if (theirs == rank_) {
        // This rank is the one it waited for: its own failure, no peer lost.
        s = absl::AbortedError(absl::StrCat(head, ", waiting for this rank"));
      } else {
        // It blames the rank it waited for: so does this rank.
        s = PeerLostError(
            absl::AbortedError(theirs >= 0 ? absl::StrCat(head, ", waiting for rank ", theirs)
                                           : head),
            options_.global_ranks, theirs, options_.blame_payload);
      }
      blamed = theirs == rank_ ? -1 : theirs;
      break;
    }
  }
  if (!s.ok()) {
    segment_->control(rank_)->gave_up.store(blamed >= 0 ? static_cast<uint32_t>(blamed) + 2 : 1,
                                            std::memory_order_release);
  }
  return s;
}

Status ShmCommunicator::WaitForAll(uint64_t seq, const char* name, MonoTime deadline,
                                   int* blamed) {
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
        // This rank follows r's failure.
        *blamed = r;
        return PeerLostError(absl::UnavailableError(absl::StrCat("shm ", name, " #", seq, " on rank ",
                                                                 rank_, ": rank ", r, " (pid ", pid,
                                                                 ") exited")),
                             options_.global_ranks, r, options_.blame_payload);
      }
    }
    if (now > deadline) {
      *blamed = missing.empty() ? -1 : missing.front();
      return PeerLostError(
          absl::DeadlineExceededError(absl::StrCat("shm ", name, " #", seq, " on rank ", rank_,
                                                   ": ranks ", FormatRanks(missing),
                                                   " did not arrive within ",
                                                   ToSeconds(options_.timeout), " s")),
          options_.global_ranks, missing.empty() ? -1 : missing.front(), options_.blame_payload);
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

StatusOr<at::Tensor> ShmCommunicator::AllocateBucketMemory(int64_t numel, at::ScalarType dtype) {
  if (numel <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm: bucket memory of ", numel, " elements (want at least 1)"));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t want = static_cast<size_t>(numel) * c10::elementSize(dtype);
  auto region = std::make_shared<Region>();
  region->buffer_bytes = (want + page - 1) / page * page;
  region->map_bytes = kLine + region->buffer_bytes * static_cast<size_t>(world_size_);
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    region->id = ++regions_made_;
  }
  const std::string key = absl::StrCat(options_.key_prefix, "/region/", region->id);
  const std::string who = absl::StrCat("shm: rank ", rank_);
  const std::string what = absl::StrCat("bucket region ", region->id);
  // Why this rank cannot use the region; empty when it can.
  std::string failure;
  UniqueFd fd;
  uint64_t nonce = 0;
  // Takes the memfd (rank 0's own, or opened) and maps it.
  auto adopt = [&](StatusOr<UniqueFd> got) {
    if (!got.ok()) {
      failure = std::string(got.status().message());
      return;
    }
    fd = *std::move(got);
    void* base = mmap(nullptr, region->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) {
      failure = Errno(absl::StrCat(who, ": mapping ", what));
    } else {
      region->base = static_cast<uint8_t*>(base);
    }
  };
  if (rank_ == 0) {
    nonce = RandomNonce();
    adopt(MakeMemfd(absl::StrCat(who, " (", what, ")"), region->map_bytes));
    // The header, before the others can find the region.
    if (failure.empty()) WriteHeader(region->base, nonce, region->buffer_bytes, world_size_);
    RETURN_IF_ERROR(Annotate(store_->Set(key, failure.empty() ? PublishedMemfd(fd.get(), nonce) : "-"),
                             absl::StrCat(who, ": publishing ", what)));
  } else {
    RETURN_IF_ERROR(WaitForRanks(store_, {{0, key}}, options_.connect_timeout,
                                 absl::StrCat(who, " waiting for rank 0's ", what),
                                 options_.progress, kBootstrapProgressInterval,
                                 options_.global_ranks));
    auto published = store_->Get(key, std::chrono::seconds(5));
    if (!published.ok()) return Annotate(published.status(), absl::StrCat(who, ": reading ", what));
    if (*published == "-") {
      failure = "rank 0 could not create it";
    } else {
      std::string where;
      adopt(OpenPublishedMemfd(who, what, *published, region->map_bytes, world_size_,
                               region->buffer_bytes, &where, &nonce));
      if (failure.empty() && !IsPublishedHeader(region->base, nonce)) {
        failure = absl::StrCat(who, ": ", what, " is not the one rank 0 published");
      }
    }
    fd.Reset();
  }
  // Every rank's verdict; rank 0 keeps its memfd open until all are in (the
  // others have opened it, or given up, by then).
  RETURN_IF_ERROR(Annotate(store_->Set(absl::StrCat(key, "/mapped/", rank_),
                                       failure.empty() ? "ok" : failure),
                           absl::StrCat(who, ": reporting on ", what)));
  std::vector<std::pair<int, std::string>> verdicts;
  for (int r = 0; r < world_size_; ++r) verdicts.push_back({r, absl::StrCat(key, "/mapped/", r)});
  RETURN_IF_ERROR(WaitForRanks(store_, verdicts, options_.connect_timeout,
                               absl::StrCat(who, " waiting for every rank to map ", what),
                               options_.progress, kBootstrapProgressInterval,
                               options_.global_ranks));
  for (const auto& [r, verdict_key] : verdicts) {
    auto verdict = store_->Get(verdict_key, std::chrono::seconds(5));
    if (!verdict.ok()) return Annotate(verdict.status(), absl::StrCat(who, ": reading ", what));
    if (*verdict != "ok") {
      // Ordinary memory on every rank, then; said once, by each rank.
      if (options_.progress) {
        options_.progress(absl::StrCat(who, ": ", what, " not used, buckets stay in ordinary "
                                       "memory (in-place allreduce off): rank ", r, ": ",
                                       *verdict));
      }
      return at::Tensor();
    }
  }
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    regions_.erase(std::remove_if(regions_.begin(), regions_.end(),
                                  [](const std::weak_ptr<Region>& r) { return r.expired(); }),
                   regions_.end());
    regions_.push_back(region);
  }
  // The tensor keeps the region mapped; the last tensor in it unmaps it.
  return at::from_blob(
      region->buffer(rank_), {numel}, [region](void*) mutable { region.reset(); },
      at::TensorOptions().dtype(dtype));
}

std::shared_ptr<ShmCommunicator::Region> ShmCommunicator::RegionOf(const at::Tensor& tensor,
                                                                   size_t* offset) const {
  if (!tensor.is_contiguous()) return nullptr;
  const auto* p = static_cast<const uint8_t*>(tensor.data_ptr());
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (const auto& weak : regions_) {
    std::shared_ptr<Region> region = weak.lock();
    if (region == nullptr) continue;
    const uint8_t* mine = region->buffer(rank_);
    if (p >= mine && p + tensor.nbytes() <= mine + region->buffer_bytes) {
      *offset = static_cast<size_t>(p - mine);
      return region;
    }
  }
  return nullptr;
}

Status ShmCommunicator::CheckPlacements(uint64_t seq) const {
  struct Where {
    uint32_t kind;
    uint64_t region, offset, nbytes;
    bool operator!=(const Where& o) const {
      return kind != o.kind || region != o.region || offset != o.offset || nbytes != o.nbytes;
    }
    std::string Text() const { return Placement(kind, region, offset, nbytes); }
  };
  auto where = [this](int r) {
    const Control* c = segment_->control(r);
    return Where{c->kind.load(std::memory_order_relaxed), c->region.load(std::memory_order_relaxed),
                 c->offset.load(std::memory_order_relaxed), c->nbytes.load(std::memory_order_relaxed)};
  };
  const Where mine = where(rank_);
  for (int r = 0; r < world_size_; ++r) {
    const Where theirs = where(r);
    if (theirs != mine) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm allreduce #", seq, " on rank ", rank_, ": ranks disagree on the tensor (rank ",
          rank_, ": ", mine.Text(), "; rank ", r, ": ", theirs.Text(),
          "): every rank must allreduce the same bucket, in the same order"));
    }
  }
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> ShmCommunicator::SliceOf(int64_t numel) const {
  return {numel * rank_ / world_size_, numel * (rank_ + 1) / world_size_};
}

std::pair<int64_t, int64_t> ShmCommunicator::OwnShare(const at::Tensor& tensor) const {
  size_t offset = 0;
  if (world_size_ < 2 || !tensor.defined() || tensor.scalar_type() != at::kFloat ||
      !tensor.device().is_cpu() || RegionOf(tensor, &offset) == nullptr) {
    return {0, 0};
  }
  return SliceOf(tensor.numel());
}

namespace {

// The op the peers check and the dtype rules apply to: a divided sum is an
// average, whatever the divisor.
ReduceOp OpOfDivisor(double divisor) { return divisor != 1.0 ? ReduceOp::kAvg : ReduceOp::kSum; }

}  // namespace

void ShmCommunicator::ReduceInRegion(const Region& region, const at::Tensor& tensor,
                                     size_t offset, double divisor,
                                     const std::vector<InputPiece>& pieces) {
  const int64_t es = static_cast<int64_t>(tensor.element_size());
  const auto [lo, hi] = SliceOf(tensor.numel());
  if (tensor.scalar_type() == at::kFloat) {
    // One pass over this rank's slice: its own input (from its buffer, or
    // from the pieces where they cover it) and the peers' added in rank
    // order, divided, and written to every rank's buffer.
    auto at_elem = [&](int r, int64_t i) {
      return reinterpret_cast<float*>(region.buffer(r) + offset) + i;
    };
    std::vector<const float*> ins(static_cast<size_t>(world_size_));
    std::vector<float*> outs(static_cast<size_t>(world_size_));
    auto reduce = [&](int64_t from, int64_t to, const float* own) {
      if (to <= from) return;
      ins[0] = own;
      for (int r = 0, k = 1; r < world_size_; ++r) {
        if (r != rank_) ins[static_cast<size_t>(k++)] = at_elem(r, from);
        outs[static_cast<size_t>(r)] = at_elem(r, from);
      }
      ReduceToAll(ins.data(), world_size_, static_cast<float>(divisor), outs.data(), world_size_,
                  to - from);
    };
    int64_t done = lo;
    for (const InputPiece& p : pieces) {  // sorted, disjoint, inside [lo, hi)
      reduce(done, p.offset, at_elem(rank_, done));
      done = p.offset + p.source.numel();
      reduce(p.offset, done, p.source.data_ptr<float>());
      elements_read_from_pieces_ += static_cast<uint64_t>(p.source.numel());
    }
    reduce(done, hi, at_elem(rank_, done));
    return;
  }
  // Other dtypes: a cache-sized piece at a time, the sum formed in this
  // rank's own buffer, then copied into the peers' while it is still in
  // this core's cache.
  constexpr int64_t kPieceBytes = 512 << 10;
  const auto dtype = at::TensorOptions().dtype(tensor.scalar_type());
  for (int64_t start = lo; start < hi; start += kPieceBytes / es) {
    const int64_t len = std::min(kPieceBytes / es, hi - start);
    const size_t at = offset + static_cast<size_t>(start * es);
    at::Tensor acc = at::from_blob(region.buffer(rank_) + at, {len}, dtype);
    for (int r = 0; r < world_size_; ++r) {
      if (r != rank_) acc.add_(at::from_blob(region.buffer(r) + at, {len}, dtype));
    }
    if (divisor != 1.0) acc.div_(divisor);
    for (int r = 0; r < world_size_; ++r) {
      if (r != rank_) std::memcpy(region.buffer(r) + at, acc.data_ptr(), static_cast<size_t>(len * es));
    }
  }
}

Status ShmCommunicator::RunAllReduce(const at::Tensor& tensor, double divisor,
                                     const std::vector<InputPiece>& pieces, uint64_t seq,
                                     MonoTime deadline) {
  const ReduceOp op = OpOfDivisor(divisor);
  // Where the tensor is, for the peers to check against theirs.
  size_t offset = 0;
  const std::shared_ptr<Region> region = RegionOf(tensor, &offset);
  // The pieces the reduction reads in place: in bucket memory, float32,
  // inside this rank's slice. The rest of their input is copied in now,
  // before the peers may read it.
  std::vector<InputPiece> in_place;
  if (region != nullptr && tensor.scalar_type() == at::kFloat) {
    const auto [lo, hi] = SliceOf(tensor.numel());
    std::vector<InputPiece> copy_in;
    for (const InputPiece& p : pieces) {
      const int64_t end = p.offset + p.source.numel();
      const int64_t from = std::max(p.offset, lo), to = std::min(end, hi);
      if (to <= from) {
        copy_in.push_back(p);
        continue;
      }
      const at::Tensor src = p.source.view(-1);
      in_place.push_back({from, src.narrow(0, from - p.offset, to - from)});
      if (p.offset < from) copy_in.push_back({p.offset, src.narrow(0, 0, from - p.offset)});
      if (to < end) copy_in.push_back({to, src.narrow(0, to - p.offset, end - to)});
    }
    CopyInputPieces(tensor, copy_in);
  } else {
    CopyInputPieces(tensor, pieces);
  }
  Control* me = segment_->control(rank_);
  me->kind.store(static_cast<uint32_t>(tensor.scalar_type()) << 8 | static_cast<uint32_t>(op),
                 std::memory_order_relaxed);
  me->region.store(region ? region->id : 0, std::memory_order_relaxed);
  me->offset.store(offset, std::memory_order_relaxed);
  me->nbytes.store(tensor.nbytes(), std::memory_order_relaxed);
  if (region != nullptr) {
    // Every rank's bucket is final once all have arrived; every slice is
    // written everywhere once all arrive again.
    RETURN_IF_ERROR(Arrive(seq, "allreduce", deadline));
    RETURN_IF_ERROR(CheckPlacements(seq));
    ReduceInRegion(*region, tensor, offset, divisor, in_place);
    RETURN_IF_ERROR(Arrive(seq, "allreduce", deadline));
    ++in_place_allreduces_;
    return absl::OkStatus();
  }
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
    if (off == 0) RETURN_IF_ERROR(CheckPlacements(seq));
    // This rank reduces [lo, hi) of the chunk, in place in its own slot.
    const int64_t lo = n * rank_ / world, hi = n * (rank_ + 1) / world;
    if (hi > lo) {
      at::Tensor acc = at::from_blob(HalfOf(rank_, half) + lo * es, {hi - lo}, dtype);
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_) acc.add_(at::from_blob(HalfOf(r, half) + lo * es, {hi - lo}, dtype));
      }
      if (divisor != 1.0) acc.div_(divisor);
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
  return AllReduceFrom(std::move(tensor), op, {});
}

std::shared_ptr<Work> ShmCommunicator::AllReduceFrom(at::Tensor tensor, ReduceOp op,
                                                     std::vector<InputPiece> pieces) {
  if (Status s = CheckCpuAllReduce(tensor, op); !s.ok()) return Work::Failed(s);
  return AllReduceDividedFrom(std::move(tensor), op == ReduceOp::kAvg ? world_size_ : 1.0,
                              std::move(pieces));
}

std::shared_ptr<Work> ShmCommunicator::AllReduceDividedFrom(at::Tensor tensor, double divisor,
                                                            std::vector<InputPiece> pieces) {
  if (Status s = CheckCpuAllReduce(tensor, OpOfDivisor(divisor)); !s.ok()) return Work::Failed(s);
  if (!(divisor >= 1.0)) {
    return Work::Failed(absl::InvalidArgumentError(
        absl::StrCat("shm allreduce: the divisor must be at least 1, got ", divisor)));
  }
  if (Status s = CheckInputPieces(tensor, pieces); !s.ok()) return Work::Failed(s);
  return Enqueue("allreduce", [this, tensor, divisor, pieces = std::move(pieces)](
                                  uint64_t seq, MonoTime deadline) {
    if (tensor.numel() == 0 || world_size_ == 1) {
      CopyInputPieces(tensor, pieces);  // the sum over one rank
      if (divisor != 1.0) tensor.div_(divisor);
      return absl::OkStatus();
    }
    return RunAllReduce(tensor, divisor, pieces, seq, deadline);
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
