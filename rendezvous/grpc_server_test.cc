#include "rendezvous/grpc_server.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace lockstep {
namespace rendezvous {
namespace {

TEST(GrpcServerTest, SecondServerOnAUsedPortFailsNamingTheAddress) {
  auto first = StoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());

  auto second = StoreServer::Start(address);
  ASSERT_FALSE(second.ok()) << "a second server bound " << address << " beside the first";
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(address), std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find("Address already in use"), std::string::npos)
      << second.status();

  // The first server still answers every call.
  auto client = ConnectStore(address, "job/1", std::chrono::seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE((*client)->Set(absl::StrCat("k", i), "v").ok());
  }
  EXPECT_EQ(*(*client)->NumKeys(), 6);
}

TEST(GrpcServerTest, WhyCannotListenExplainsEachFailure) {
  auto first = StoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(WhyCannotListen(absl::StrCat("127.0.0.1:", (*first)->port())).find("in use"),
            std::string::npos);
  // 192.0.2.1 (TEST-NET-1) is documentation-only: never an address of this host.
  EXPECT_NE(WhyCannotListen("192.0.2.1:0").find("not an address of this host"), std::string::npos);
  EXPECT_NE(WhyCannotListen("127.0.0.1").find("no port"), std::string::npos);
  EXPECT_EQ(WhyCannotListen("127.0.0.1:0"), "");
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
