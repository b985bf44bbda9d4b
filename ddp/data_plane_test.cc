#include "ddp/data_plane.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace ddp {
namespace {

TEST(DataPlaneTest, OverrideWinsOverEverything) {
  DataPlaneInputs in;
  in.override_host = "10.9.9.9";
  in.node_addr = "127.0.0.1";
  in.master_host = "127.0.0.1";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->address, "10.9.9.9");
  EXPECT_EQ(got->source, "override");
}

TEST(DataPlaneTest, NodeAddressFromTheAgentIsUsedAsItResolves) {
  DataPlaneInputs in;
  in.node_addr = "localhost";
  in.store_host = "127.0.0.1";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->address, "127.0.0.1");
  EXPECT_EQ(got->source, "LOCKSTEP_NODE_ADDR");
}

TEST(DataPlaneTest, HandStartedWorkerUsesTheRouteToMasterAddr) {
  DataPlaneInputs in;
  in.master_host = "127.0.0.5";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_TRUE(got.ok()) << got.status();
  // The kernel sends to 127.0.0.5 from 127.0.0.1.
  EXPECT_EQ(got->address, "127.0.0.1");
  EXPECT_EQ(got->source, "route to MASTER_ADDR");
}

TEST(DataPlaneTest, NothingKnownFallsBackToLoopback) {
  auto got = ChooseDataPlaneAddress(DataPlaneInputs{});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->address, "127.0.0.1");
  EXPECT_EQ(got->source, "default");
}

TEST(DataPlaneTest, UnresolvableNodeAddressIsAnErrorNamingIt) {
  DataPlaneInputs in;
  in.node_addr = "no-such-host.invalid";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("no-such-host.invalid"), std::string::npos);
}

// An override that does not resolve used to reach Gloo, which crashed the
// worker (SIGSEGV in CreateDeviceAttr).
TEST(DataPlaneTest, UnresolvableOverrideIsAnErrorNamingTheVariableAndTheValue) {
  DataPlaneInputs in;
  in.override_host = "nosuch.invalid";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("LOCKSTEP_GLOO_HOST"), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find("'nosuch.invalid' does not resolve"), std::string::npos)
      << got.status();
}

// LOCKSTEP_GLOO_HOST=lo: an interface name where an address belongs.
TEST(DataPlaneTest, AnInterfaceNameAsTheOverrideSaysItTakesAnAddress) {
  DataPlaneInputs in;
  in.override_host = "lo";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("takes an address or host name"), std::string::npos)
      << got.status();
  EXPECT_NE(got.status().message().find("GLOO_SOCKET_IFNAME=lo"), std::string::npos)
      << got.status();
}

// torchrun's habit: GLOO_SOCKET_IFNAME names the interface to bind.
TEST(DataPlaneTest, GlooSocketIfnameBindsThatInterfacesAddress) {
  DataPlaneInputs in;
  in.socket_ifname = "lo";
  in.node_addr = "192.0.2.1";
  in.master_host = "192.0.2.1";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->address, "127.0.0.1");
  EXPECT_EQ(got->source, "GLOO_SOCKET_IFNAME");
  // A list (PyTorch's several devices): the first interface.
  in.socket_ifname = "lo,nosuchif0";
  got = ChooseDataPlaneAddress(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->address, "127.0.0.1");
}

TEST(DataPlaneTest, UnknownGlooSocketIfnameIsAnErrorNamingIt) {
  DataPlaneInputs in;
  in.socket_ifname = "nosuchif0";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find("GLOO_SOCKET_IFNAME='nosuchif0'"), std::string::npos)
      << got.status();
}

TEST(DataPlaneTest, TheOverrideWinsOverGlooSocketIfname) {
  DataPlaneInputs in;
  in.override_host = "127.0.0.1";
  in.socket_ifname = "nosuchif0";
  auto got = ChooseDataPlaneAddress(in);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->address, "127.0.0.1");
  EXPECT_EQ(got->source, "override, over GLOO_SOCKET_IFNAME");
}

TEST(DataPlaneTest, LoopbackAndInterfaces) {
  EXPECT_TRUE(ResolvesToLoopback("127.0.0.1"));
  EXPECT_TRUE(ResolvesToLoopback("localhost"));
  EXPECT_FALSE(ResolvesToLoopback("192.0.2.1"));
  EXPECT_EQ(InterfaceOf("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceOf("192.0.2.1"), "");
}

}  // namespace
}  // namespace ddp
}  // namespace lockstep
