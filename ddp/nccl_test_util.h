// Shared by the GPU tests: skip with the reason where NCCL cannot run, and a
// world-of-one NcclCommunicator on device 0 (the GPU machines have one GPU).
#ifndef LOCKSTEP_DDP_NCCL_TEST_UTIL_H_
#define LOCKSTEP_DDP_NCCL_TEST_UTIL_H_

#include <chrono>
#include <memory>
#include <string>

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

// Rank 0 of 1 on device 0, or null after a test failure naming the error.
inline std::unique_ptr<NcclCommunicator> MakeWorldOfOne(FakeStore* store) {
  NcclOptions options;
  options.device = 0;
  options.connect_timeout = std::chrono::seconds(30);
  auto comm = NcclCommunicator::Create(store, 0, 1, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_NCCL_TEST_UTIL_H_
