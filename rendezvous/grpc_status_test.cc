#include "rendezvous/grpc_status.h"

#include "gtest/gtest.h"

namespace lockstep {
namespace {

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTripsWithMessage) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status status(static_cast<absl::StatusCode>(code), code == 0 ? "" : "what happened");
    grpc::Status wire = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(wire), status);
  }
}

TEST(GrpcStatusTest, ContextIsPrependedToErrorsOnly) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "store at x").ok());
  absl::Status down = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused"),
                                     "store at x:1");
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(down.message(), "store at x:1: refused");
}

TEST(GrpcStatusTest, UnknownCodeFromTheWireBecomesUnknown) {
  EXPECT_EQ(StatusFromCode(99, "odd").code(), absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace lockstep
