#include "common/worker_link.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/worker_env.h"

namespace lockstep {
namespace worker_link {
namespace {

constexpr size_t kPage = 4096;

StatusOr<int> NewMemfd(const char* name, size_t bytes, bool sealable) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("memfd_create ", name, ": ", std::strerror(errno)));
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("ftruncate ", name, ": ", std::strerror(err)));
  }
  return fd;
}

// The descriptor number in `name`, or -1 when unset or not a descriptor.
int FdFromEnv(const char* name) {
  const char* v = std::getenv(name);
  int fd = -1;
  if (v == nullptr || !absl::SimpleAtoi(v, &fd) || fd < 0) return -1;
  return ::fcntl(fd, F_GETFD) == -1 ? -1 : fd;
}

}  // namespace

int64_t MonotonicNowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// ---------------------------------------------------------------- agent side

FencePage::~FencePage() {
  if (deadline_ != nullptr) ::munmap(deadline_, kPage);
  if (fd_ >= 0) ::close(fd_);
}

Status FencePage::Create() {
  ASSIGN_OR_RETURN(fd_, NewMemfd("lockstep-fence", kPage, /*sealable=*/true));
  void* p = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("mmap fence page: ", std::strerror(errno)));
  }
  deadline_ = new (p) std::atomic<int64_t>(0);
  // From here on nobody can map it writable or resize it: a worker can read
  // its deadline but never move it.
  int seals = F_SEAL_SHRINK | F_SEAL_GROW;
#ifdef F_SEAL_FUTURE_WRITE
  seals |= F_SEAL_FUTURE_WRITE;
#endif
  if (::fcntl(fd_, F_ADD_SEALS, seals) != 0) {
    return absl::UnavailableError(absl::StrCat("sealing the fence page: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void FencePage::SetDeadline(int64_t deadline_ns) {
  if (deadline_ != nullptr) deadline_->store(deadline_ns, std::memory_order_release);
}

int64_t FencePage::deadline() const {
  return deadline_ == nullptr ? 0 : deadline_->load(std::memory_order_acquire);
}

StatusPage::~StatusPage() {
  if (slot_ != nullptr) ::munmap(slot_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

Status StatusPage::Create(int slots) {
  slots_ = std::max(1, slots);
  // Slots in the first half, end instants in the second: a worker finds
  // its instant from the page's size alone.
  bytes_ = (2 * slots_ * sizeof(int64_t) + kPage - 1) / kPage * kPage;
  ASSIGN_OR_RETURN(fd_, NewMemfd("lockstep-status", bytes_, /*sealable=*/true));
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("mmap status page: ", std::strerror(errno)));
  }
  slot_ = static_cast<std::atomic<int32_t>*>(p);  // zero-filled: kNotStarted
  ended_ = reinterpret_cast<std::atomic<int64_t>*>(static_cast<char*>(p) + bytes_ / 2);
  if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return absl::UnavailableError(absl::StrCat("sealing the status page: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

int32_t StatusPage::Get(int slot) const {
  if (slot_ == nullptr || slot < 0 || slot >= slots_) return kNotStarted;
  return slot_[slot].load(std::memory_order_acquire);
}

int64_t StatusPage::EndedNs(int slot) const {
  if (ended_ == nullptr || slot < 0 || slot >= slots_) return 0;
  return ended_[slot].load(std::memory_order_acquire);
}

// --------------------------------------------------------------- worker side

namespace {

// This worker's slot and end instant on its status page.
struct OwnSlot {
  std::atomic<int32_t>* state = nullptr;
  std::atomic<int64_t>* ended = nullptr;
  pid_t pid = 0;  // the worker's: a child forked from it shares the mapping
};

const OwnSlot& OwnSlotInstance();

void EndingAtExit() {
  if (::getpid() == OwnSlotInstance().pid) MarkEnding();
}

// Mapped once and kept for the life of the process.
const OwnSlot& OwnSlotInstance() {
  static const OwnSlot slot = [] {
    OwnSlot s;
    const int fd = FdFromEnv(kStatusFdEnv);
    int local_rank = -1;
    const char* lr = std::getenv(worker_env::kLocalRank);
    if (fd < 0 || lr == nullptr || !absl::SimpleAtoi(lr, &local_rank) || local_rank < 0) {
      return s;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 ||
        static_cast<size_t>(st.st_size) < (local_rank + 1) * sizeof(int32_t)) {
      return s;
    }
    void* p = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return s;
    s.state = static_cast<std::atomic<int32_t>*>(p) + local_rank;
    const size_t half = static_cast<size_t>(st.st_size) / 2;
    // A page too small for the instants (an agent older than them) keeps
    // the states alone.
    if (half % sizeof(int64_t) == 0 && (local_rank + 1) * sizeof(int32_t) <= half &&
        half + (local_rank + 1) * sizeof(int64_t) <= static_cast<size_t>(st.st_size)) {
      s.ended = reinterpret_cast<std::atomic<int64_t>*>(static_cast<char*>(p) + half) + local_rank;
    }
    s.pid = ::getpid();
    std::atexit(EndingAtExit);
    return s;
  }();
  return slot;
}

}  // namespace

void MarkBootstrap(int32_t state) {
  const OwnSlot& slot = OwnSlotInstance();
  if (slot.state != nullptr) slot.state->store(state, std::memory_order_release);
}

void MarkEnding() {
  const OwnSlot& slot = OwnSlotInstance();
  if (slot.ended == nullptr) return;
  int64_t none = 0;
  slot.ended->compare_exchange_strong(none, MonotonicNowNs(), std::memory_order_acq_rel);
}

void MarkPeerLost(int lost_rank) {
  MarkBootstrap(lost_rank >= 0 && lost_rank < kPeerLostOnRank0 ? PeerLostOn(lost_rank) : kPeerLost);
  MarkEnding();
}

bool StartFenceWatchdog() {
  static std::once_flag once;
  static bool running = false;
  std::call_once(once, [] {
    const int fd = FdFromEnv(kFenceFdEnv);
    if (fd < 0) return;
    void* p = ::mmap(nullptr, kPage, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return;
    const auto* deadline = static_cast<const std::atomic<int64_t>*>(p);
    running = true;
    std::thread([deadline] {
      while (true) {
        const int64_t d = deadline->load(std::memory_order_acquire);
        if (d != 0 && MonotonicNowNs() > d) {
          static const char kMsg[] =
              "lockstep: fenced: this node's agent has not renewed its lease with the "
              "coordinator in time (it is cut off or frozen), so its ranks may be given to "
              "another node; killing this worker's process group\n";
          (void)!::write(2, kMsg, sizeof(kMsg) - 1);
          ::kill(0, SIGKILL);
          ::_exit(137);
        }
        ::usleep(50 * 1000);
      }
    }).detach();
  });
  return running;
}

}  // namespace worker_link
}  // namespace lockstep
