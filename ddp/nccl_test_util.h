// Shared by the GPU tests: skip with the reason where NCCL cannot run, and a
// world-of-one NcclCommunicator on device 0 (the GPU machines have one GPU).
#ifndef LOCKSTEP_DDP_NCCL_TEST_UTIL_H_
#define LOCKSTEP_DDP_NCCL_TEST_UTIL_H_

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#ifdef LOCKSTEP_WITH_NCCL
#include <cuda_runtime_api.h>

#include <atomic>
#endif

#include "ddp/fake_store.h"
#include "ddp/nccl_communicator.h"
#include "gtest/gtest.h"

// Skips the current test, printing why, unless NCCL, a CUDA device and a
// CUDA-capable LibTorch are all there.
#define LOCKSTEP_SKIP_WITHOUT_GPU()                                 \
  do {                                                              \
    const std::string reason = ::lockstep::ddp::NcclUnavailableReason(); \
    if (!reason.empty()) GTEST_SKIP() << "no NCCL GPU: " << reason; \
  } while (0)

namespace lockstep {
namespace ddp {

// Rank 0 of 1 on device 0 with the given collective timeout, or null after a
// test failure naming the error.
inline std::unique_ptr<NcclCommunicator> MakeWorldOfOne(
    FakeStore* store, Duration timeout = kDefaultCollectiveTimeout) {
  NcclOptions options;
  options.device = 0;
  options.timeout = timeout;
  options.connect_timeout = std::chrono::seconds(30);
  auto comm = NcclCommunicator::Create(store, 0, 1, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

#ifdef LOCKSTEP_WITH_NCCL
// Holding the default stream: a host callback queued on it that returns only
// once released (or after 60 s), so whatever is queued behind it, a
// collective's ready event included, cannot run. With one GPU this stands in
// for a peer that never arrives.
inline std::atomic<bool>& DefaultStreamReleased() {
  static std::atomic<bool> released{false};
  return released;
}

inline void CUDART_CB HoldUntilReleased(void*) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!DefaultStreamReleased().load() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Holds the default stream now and releases it after `hold` from another
// thread (ncclCommAbort may itself wait for a stream with a queued kernel, so
// the test thread must not be the one to release it). Join the thread.
inline std::thread HoldDefaultStream(std::chrono::milliseconds hold) {
  DefaultStreamReleased() = false;
  EXPECT_EQ(cudaLaunchHostFunc(nullptr, HoldUntilReleased, nullptr), cudaSuccess);
  return std::thread([hold] {
    std::this_thread::sleep_for(hold);
    DefaultStreamReleased() = true;
  });
}
#endif  // LOCKSTEP_WITH_NCCL

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_NCCL_TEST_UTIL_H_
