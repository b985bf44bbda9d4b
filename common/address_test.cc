#include "common/address.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(AddressTest, HostAndPort) {
  EXPECT_EQ(HostOfAddress("10.0.0.1:29500"), "10.0.0.1");
  EXPECT_EQ(PortOfAddress("10.0.0.1:29500"), "29500");
  EXPECT_EQ(HostOfAddress("[::1]:29500"), "::1");
  EXPECT_EQ(PortOfAddress("[::1]:29500"), "29500");
  EXPECT_EQ(HostOfAddress("node-a"), "node-a");
  EXPECT_EQ(PortOfAddress("node-a"), "");
  EXPECT_EQ(HostOfAddress("fe80::1"), "fe80::1");
  EXPECT_EQ(PortOfAddress("fe80::1"), "");
  EXPECT_EQ(HostOfAddress("[fe80::1]"), "fe80::1");
}

}  // namespace
}  // namespace lockstep
