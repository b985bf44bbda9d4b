// Conformance suite for the Store interface: every implementation (memory,
// gRPC client, file store) must pass the same tests.
//
// To run it against an implementation, link //rendezvous:store_conformance
// into a test and instantiate it with a factory of environments:
//
//   class MyEnv : public StoreConformanceEnv {
//     std::unique_ptr<Store> Open(const std::string& ns) override { ... }
//   };
//   INSTANTIATE_TEST_SUITE_P(Mine, StoreConformanceTest,
//       ::testing::Values(StoreEnvFactory([] { return std::make_unique<MyEnv>(); })));
//
// One environment is created per test; every Open() call on it returns a new
// client handle onto the same backing store (handles on the same namespace see
// each other's writes; different namespaces are isolated).
#ifndef LOCKSTEP_RENDEZVOUS_STORE_CONFORMANCE_H_
#define LOCKSTEP_RENDEZVOUS_STORE_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "rendezvous/store.h"

namespace lockstep {
namespace rendezvous {

class StoreConformanceEnv {
 public:
  virtual ~StoreConformanceEnv() = default;
  // A new handle on namespace `ns` of this environment's backing store.
  virtual std::unique_ptr<Store> Open(const std::string& ns) = 0;
};

using StoreEnvFactory = std::function<std::unique_ptr<StoreConformanceEnv>()>;

class StoreConformanceTest : public ::testing::TestWithParam<StoreEnvFactory> {
 protected:
  void SetUp() override;
  std::unique_ptr<StoreConformanceEnv> env_;
  std::unique_ptr<Store> store_;  // env_->Open("conformance/1")
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_STORE_CONFORMANCE_H_
