// A file descriptor closed when its owner goes.
#ifndef LOCKSTEP_COMMON_UNIQUE_FD_H_
#define LOCKSTEP_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace lockstep {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  // Gives up ownership: the caller closes the returned fd.
  int release() { return std::exchange(fd_, -1); }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_UNIQUE_FD_H_
