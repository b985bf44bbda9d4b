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
#include "absl/strings/str_join.h"
#include "common/unique_fd.h"
#include "common/worker_link.h"
#include "ddp/missing_ranks.h"
#include "ddp/streaming.h"

namespace lockstep {
namespace ddp {
namespace {

// "LKSTEPS2", little-endian: layout 2 (call lines after the control lines).
// Bumped with the layout, so a rank of another build is refused.
constexpr uint64_t kMagic = 0x3253504554534b4cULL;
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
  // first barrier: the bucket-memory region (0: ordinary memory) and the
  // offset in this rank's buffer there (its size, dtype and op are in the
  // call line, compared first).
  std::atomic<uint64_t> region;
  std::atomic<uint64_t> offset;
};
static_assert(sizeof(Control) == kLine, "one control line per rank");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "atomics shared between processes");

enum class CallKind : uint32_t { kNone = 0, kAllReduce, kBroadcast, kAllGather, kBarrier };

// One per rank, after the control lines: the collectives this rank entered
// (see "Agreement" in the header), written only by their rank. Two
// entries, indexed by seq & 1: a peer that finished a one-barrier
// collective may publish the next before this rank has read the current.
struct alignas(kLine) CallLine {
  struct Entry {
    std::atomic<uint64_t> seq;
    std::atomic<uint32_t> kind;   // CallKind; kNone: nothing published here yet
    std::atomic<uint32_t> dtype;  // at::ScalarType
    std::atomic<uint64_t> arg;    // allreduce: the divisor's bits; broadcast: the root
    std::atomic<uint64_t> nbytes;
  };
  Entry entry[2];
};
static_assert(sizeof(CallLine) == kLine, "one call line per rank");

// The header, the control lines, the call lines, the slots.
size_t CallLineOffset(int world, int rank) {
  return kLine + kLine * static_cast<size_t>(world + rank);
}
size_t SlotsOffset(int world) { return CallLineOffset(world, world); }
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

uint64_t BitsOf(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}
double DoubleOf(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

const char* KindName(CallKind kind) {
  switch (kind) {
    case CallKind::kAllReduce: return "allreduce";
    case CallKind::kBroadcast: return "broadcast";
    case CallKind::kAllGather: return "allgather";
    case CallKind::kBarrier: return "barrier";
    case CallKind::kNone: break;
  }
  return "no collective";
}

// The rank a control line's gave_up blames (-1: none).
int BlamedBy(uint32_t gave_up) { return gave_up >= 2 ? static_cast<int>(gave_up) - 2 : -1; }

}  // namespace

// What a collective is, as the ranks compare it (see "Agreement").
struct ShmCommunicator::Call {
  CallKind kind = CallKind::kNone;
  at::ScalarType dtype = at::ScalarType::Undefined;
  uint64_t arg = 0;     // allreduce: BitsOf(divisor); broadcast: the root; else 0
  uint64_t nbytes = 0;  // allgather: each rank's input

  bool operator==(const Call& o) const {
    return kind == o.kind && dtype == o.dtype && arg == o.arg && nbytes == o.nbytes;
  }
  // "broadcast #7 (1024 bytes of Float, root 0)".
  std::string Text(uint64_t seq, int world) const {
    std::string text = absl::StrCat(KindName(kind), " #", seq);
    const std::string bytes = absl::StrCat(nbytes, " bytes of ", c10::toString(dtype));
    switch (kind) {
      case CallKind::kAllReduce: {
        const double divisor = DoubleOf(arg);
        const std::string op = divisor == 1.0 ? std::string("sum")
                               : divisor == world ? std::string("average")
                                                  : absl::StrCat("sum divided by ", divisor);
        absl::StrAppend(&text, " (", bytes, ", ", op, ")");
        break;
      }
      case CallKind::kBroadcast:
        absl::StrAppend(&text, " (", bytes, ", root ", arg, ")");
        break;
      case CallKind::kAllGather:
        absl::StrAppend(&text, " (", bytes, " from each rank)");
        break;
      case CallKind::kBarrier:
      case CallKind::kNone:
        break;
    }
    return text;
  }
};

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
  CallLine* calls(int rank) const {
    return reinterpret_cast<CallLine*>(base +
                                       CallLineOffset(static_cast<int>(header()->world), rank));
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
    // (Not segment->calls(): the header's world is written below.)
    for (int r = 0; r < world_size; ++r) {
      auto* line = new (segment->base + CallLineOffset(world_size, r)) CallLine;
      for (CallLine::Entry& e : line->entry) {
        e.seq.store(0, std::memory_order_relaxed);
        e.kind.store(static_cast<uint32_t>(CallKind::kNone), std::memory_order_relaxed);
      }
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

void ShmCommunicator::Publish(uint64_t seq, const Call& call) {
  CallLine::Entry& e = segment_->calls(rank_)->entry[seq & 1];
  e.kind.store(static_cast<uint32_t>(call.kind), std::memory_order_relaxed);
  e.dtype.store(static_cast<uint32_t>(call.dtype), std::memory_order_relaxed);
  e.arg.store(call.arg, std::memory_order_relaxed);
  e.nbytes.store(call.nbytes, std::memory_order_relaxed);
  // The barrier's phase store publishes the entry to the peers; the release
  // here is for LastEntered, which reads a peer's without a barrier.
  e.seq.store(seq, std::memory_order_release);
}

ShmCommunicator::Call ShmCommunicator::EntryOf(int rank, size_t index, uint64_t* seq) const {
  const CallLine::Entry& e = segment_->calls(rank)->entry[index];
  *seq = e.seq.load(std::memory_order_acquire);
  Call call;
  call.kind = static_cast<CallKind>(e.kind.load(std::memory_order_relaxed));
  call.dtype = static_cast<at::ScalarType>(e.dtype.load(std::memory_order_relaxed));
  call.arg = e.arg.load(std::memory_order_relaxed);
  call.nbytes = e.nbytes.load(std::memory_order_relaxed);
  return call;
}

std::string ShmCommunicator::LastEntered(int rank) const {
  uint64_t seq[2];
  const Call calls[2] = {EntryOf(rank, 0, &seq[0]), EntryOf(rank, 1, &seq[1])};
  int last = -1;
  for (int i = 0; i < 2; ++i) {
    if (calls[i].kind != CallKind::kNone && (last < 0 || seq[i] > seq[last])) last = i;
  }
  return last < 0 ? absl::StrCat("rank ", rank, " entered no collective yet")
                  : absl::StrCat("rank ", rank, " last entered ",
                                 KindName(calls[last].kind), " #", seq[last]);
}

Status ShmCommunicator::Enter(uint64_t seq, const Call& call, MonoTime deadline) {
  Publish(seq, call);
  const char* name = KindName(call.kind);
  RETURN_IF_ERROR(Arrive(seq, name, deadline));
  // Every rank published before this barrier and publishes the next entry
  // (the other one) only after it: all compare the same entries, so all
  // fail together, and none waits for another or blames it.
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    uint64_t their_seq = 0;
    const Call theirs = EntryOf(r, seq & 1, &their_seq);
    if (their_seq == seq && theirs == call) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "shm ", name, " #", seq, " on rank ", rank_, ": ranks are out of step: this rank is in ",
        call.Text(seq, world_size_), ", rank ", r, " is in ", theirs.Text(their_seq, world_size_),
        ": every rank must issue the same collectives, with the same sizes, dtypes and roots, "
        "in the same order"));
  }
  return absl::OkStatus();
}

void ShmCommunicator::GiveUp(int blamed) {
  segment_->control(rank_)->gave_up.store(blamed >= 0 ? static_cast<uint32_t>(blamed) + 2 : 1,
                                          std::memory_order_seq_cst);
  // Peers asleep at a barrier see it now, not at their next 10 ms check.
  Header* header = segment_->header();
  header->generation.fetch_add(1, std::memory_order_seq_cst);
  if (header->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&header->generation);
}

std::string ShmCommunicator::GaveUpText(uint64_t seq, int peer, uint32_t gave_up) const {
  // Which collective it gave up in: this one, or one this rank finished
  // (its peers all arrived) before the peer gave up waiting for a third.
  std::string where = "on it first";
  uint64_t last_seq[2];
  const Call last[2] = {EntryOf(peer, 0, &last_seq[0]), EntryOf(peer, 1, &last_seq[1])};
  const int i = last_seq[0] >= last_seq[1] ? 0 : 1;
  if (last[i].kind != CallKind::kNone && last_seq[i] != seq) {
    where = absl::StrCat("in ", KindName(last[i].kind), " #", last_seq[i]);
  }
  const int theirs = BlamedBy(gave_up);
  return absl::StrCat("rank ", peer, " gave up ", where,
                      theirs == rank_ ? ", waiting for this rank"
                      : theirs >= 0   ? absl::StrCat(", waiting for rank ", theirs)
                                      : std::string());
}

Status ShmCommunicator::FollowGaveUp(uint64_t seq, const char* name, int peer, uint32_t gave_up) {
  const int theirs = BlamedBy(gave_up);
  // Said first, so that no rank passes a barrier this one has left.
  GiveUp(theirs == rank_ ? -1 : theirs);
  const Status error = absl::AbortedError(
      absl::StrCat("shm ", name, " #", seq, " on rank ", rank_, ": ", GaveUpText(seq, peer, gave_up)));
  // This rank is the one it waited for: its own failure, no peer lost.
  if (theirs == rank_) return error;
  // It blames the rank it waited for: so does this rank.
  return PeerLostError(error, options_.global_ranks, theirs, options_.blame_payload);
}

Status ShmCommunicator::Arrive(uint64_t seq, const char* name, MonoTime deadline) {
  RETURN_IF_ERROR(WaitForAll(seq, name, deadline));
  // Every rank's phase is counted, but one may have given up meanwhile.
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    const uint32_t gave_up = segment_->control(r)->gave_up.load(std::memory_order_acquire);
    if (gave_up != 0) return FollowGaveUp(seq, name, r, gave_up);
  }
  return absl::OkStatus();
}

Status ShmCommunicator::WaitForAll(uint64_t seq, const char* name, MonoTime deadline) {
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
        // This rank follows r's failure; said before anything else.
        GiveUp(r);
        return PeerLostError(absl::UnavailableError(absl::StrCat("shm ", name, " #", seq, " on rank ",
                                                                 rank_, ": rank ", r, " (pid ", pid,
                                                                 ") exited")),
                             options_.global_ranks, r, options_.blame_payload);
      }
    }
    // Every rank arrived since all_arrived() looked: look again.
    if (missing.empty()) continue;
    // A peer that gave up means this barrier cannot pass. One that has not
    // arrived, or gave up waiting for this rank (or for none), is followed
    // as Arrive follows it. One that arrived and gave up waiting for another
    // rank gave up on the ranks this one still waits for: this rank stops
    // waiting too, and fails as its own timeout would, saying so.
    int gave_up_first = -1;
    uint32_t gave_up_word = 0;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      const uint32_t gave_up = segment_->control(r)->gave_up.load(std::memory_order_acquire);
      if (gave_up == 0) continue;
      const int theirs = BlamedBy(gave_up);
      if (std::find(missing.begin(), missing.end(), r) != missing.end() || theirs < 0 ||
          theirs == rank_) {
        return FollowGaveUp(seq, name, r, gave_up);
      }
      if (gave_up_first < 0) {
        gave_up_first = r;
        gave_up_word = gave_up;
      }
    }
    if (gave_up_first >= 0 || now > deadline) {
      const int blamed = missing.front();
      GiveUp(blamed);
      std::vector<std::string> last;
      for (int r : missing) last.push_back(LastEntered(r));
      const std::string head = absl::StrCat("shm ", name, " #", seq, " on rank ", rank_,
                                            ": ranks ", FormatRanks(missing), " did not arrive");
      const std::string text =
          gave_up_first >= 0
              ? absl::StrCat(head, " (", absl::StrJoin(last, "; "), "); ",
                             GaveUpText(seq, gave_up_first, gave_up_word))
              : absl::StrCat(head, " within ", ToSeconds(options_.timeout), " s (",
                             absl::StrJoin(last, "; "), ")");
      return PeerLostError(absl::DeadlineExceededError(text), options_.global_ranks, blamed,
                           options_.blame_payload);
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

Status ShmCommunicator::CheckPlacements(uint64_t seq, const Call& call) const {
  // The size, dtype and op are the call's, the same on every rank by now.
  const char* op = DoubleOf(call.arg) != 1.0 ? "avg" : "sum";
  auto where = [&](int r) {
    const Control* c = segment_->control(r);
    const uint64_t region = c->region.load(std::memory_order_relaxed);
    const uint64_t offset = c->offset.load(std::memory_order_relaxed);
    return std::make_pair(region, offset);
  };
  auto text = [&](std::pair<uint64_t, uint64_t> w) {
    return absl::StrCat(call.nbytes, " bytes of ", c10::toString(call.dtype), " (", op, ") in ",
                        w.first == 0 ? std::string("ordinary memory")
                                     : absl::StrCat("bucket region ", w.first, " at offset ",
                                                    w.second));
  };
  const auto mine = where(rank_);
  for (int r = 0; r < world_size_; ++r) {
    const auto theirs = where(r);
    if (theirs != mine) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm allreduce #", seq, " on rank ", rank_, ": ranks disagree on the tensor (rank ",
          rank_, ": ", text(mine), "; rank ", r, ": ", text(theirs),
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

// The op the dtype rules apply to: a divided sum is an average, whatever
// the divisor.
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
  Call call;
  call.kind = CallKind::kAllReduce;
  call.dtype = tensor.scalar_type();
  call.arg = BitsOf(divisor);
  call.nbytes = tensor.nbytes();
  if (tensor.numel() == 0) return Enter(seq, call, deadline);
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
  me->region.store(region ? region->id : 0, std::memory_order_relaxed);
  me->offset.store(offset, std::memory_order_relaxed);
  if (region != nullptr) {
    // Every rank's bucket is final once all have arrived; every slice is
    // written everywhere once all arrive again.
    RETURN_IF_ERROR(Enter(seq, call, deadline));
    RETURN_IF_ERROR(CheckPlacements(seq, call));
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
    if (off == 0) {
      RETURN_IF_ERROR(Enter(seq, call, deadline));
      RETURN_IF_ERROR(CheckPlacements(seq, call));
    } else {
      RETURN_IF_ERROR(Arrive(seq, "allreduce", deadline));
    }
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
  Call call;
  call.kind = CallKind::kBroadcast;
  call.dtype = tensor.scalar_type();
  call.arg = static_cast<uint64_t>(root);
  call.nbytes = bytes;
  if (bytes == 0) return Enter(seq, call, deadline);
  const size_t chunk = options_.slot_bytes / 2;
  auto* data = static_cast<uint8_t*>(tensor.data_ptr());
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    const size_t half = NextHalf();
    if (rank_ == root) std::memcpy(HalfOf(root, half), data + off, n);
    RETURN_IF_ERROR(off == 0 ? Enter(seq, call, deadline) : Arrive(seq, "broadcast", deadline));
    if (rank_ != root) std::memcpy(data + off, HalfOf(root, half), n);
  }
  return absl::OkStatus();
}

Status ShmCommunicator::RunAllGather(const at::Tensor& input, const at::Tensor& output,
                                     uint64_t seq, MonoTime deadline) {
  const size_t bytes = input.nbytes();
  Call call;
  call.kind = CallKind::kAllGather;
  call.dtype = input.scalar_type();
  call.nbytes = bytes;
  if (bytes == 0) return Enter(seq, call, deadline);
  const size_t chunk = options_.slot_bytes / 2;
  const auto* in = static_cast<const uint8_t*>(input.data_ptr());
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t n = std::min(chunk, bytes - off);
    const size_t half = NextHalf();
    std::memcpy(HalfOf(rank_, half), in + off, n);
    RETURN_IF_ERROR(off == 0 ? Enter(seq, call, deadline) : Arrive(seq, "allgather", deadline));
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
    if (world_size_ == 1) {
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
    if (world_size_ == 1) return absl::OkStatus();
    return RunBroadcast(tensor, root, seq, deadline);
  });
}

std::shared_ptr<Work> ShmCommunicator::AllGather(at::Tensor input, at::Tensor output) {
  if (Status s = CheckAllGather(input, output, world_size_); !s.ok()) return Work::Failed(s);
  return Enqueue("allgather", [this, input, output](uint64_t seq, MonoTime deadline) {
    if (world_size_ == 1) {
      if (input.numel() > 0) std::memcpy(output.data_ptr(), input.data_ptr(), input.nbytes());
      return absl::OkStatus();
    }
    return RunAllGather(input, output, seq, deadline);
  });
}

std::shared_ptr<Work> ShmCommunicator::Barrier() {
  return Enqueue("barrier", [this](uint64_t seq, MonoTime deadline) {
    if (world_size_ == 1) return absl::OkStatus();
    Call call;
    call.kind = CallKind::kBarrier;
    return Enter(seq, call, deadline);
  });
}

}  // namespace ddp
}  // namespace lockstep
