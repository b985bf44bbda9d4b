#include "common/address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

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

TEST(AddressTest, JoinHostPortBracketsABareIpv6Host) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", "29500"), "10.0.0.1:29500");
  EXPECT_EQ(JoinHostPort("fd00::1", "29500"), "[fd00::1]:29500");
  EXPECT_EQ(JoinHostPort("[fd00::1]", "29500"), "[fd00::1]:29500");
  EXPECT_EQ(JoinHostPort("", "29500"), ":29500");
  EXPECT_EQ(HostOfAddress(JoinHostPort("fd00::1", "7")), "fd00::1");
  EXPECT_EQ(PortOfAddress(JoinHostPort("fd00::1", "7")), "7");
}

TEST(AddressTest, DialableAddresses) {
  for (const char* good : {"10.0.0.1:29500", "[::1]:1", "node-a.example.org:65535",
                           "[fe80::1%eth0]:9001", "host_1:80"}) {
    EXPECT_TRUE(IsDialableAddress(good)) << good;
  }
  for (const char* bad : {"", "10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536",
                          "10.0.0.1:99999999999", "10.0.0.1:+80", "10.0.0.1:8x", ":80", "[]:80",
                          "fe80::1:80", "a b:80", "a%b:80", "\x1b[31mEVIL:1", "host\n:80",
                          "[::1]80"}) {
    EXPECT_FALSE(IsDialableAddress(bad)) << bad;
  }
  EXPECT_TRUE(IsDialableAddress(std::string(250, 'a') + ":80"));
  EXPECT_FALSE(IsDialableAddress(std::string(260, 'a') + ":80"));
}

// A socket address of `family` holding `host` (numeric) and `port`.
sockaddr_storage SocketAddress(int family, const char* host, uint16_t port) {
  sockaddr_storage ss{};
  ss.ss_family = static_cast<sa_family_t>(family);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  void* raw = family == AF_INET ? static_cast<void*>(&v4->sin_addr) : &v6->sin6_addr;
  EXPECT_EQ(inet_pton(family, host, raw), 1) << host;
  (family == AF_INET ? v4->sin_port : v6->sin6_port) = htons(port);
  return ss;
}

TEST(AddressTest, NumericFormsOfSocketAddresses) {
  const sockaddr_storage v4 = SocketAddress(AF_INET, "127.0.0.1", 43210);
  EXPECT_EQ(NumericHost(v4), "127.0.0.1");
  EXPECT_EQ(NumericPort(v4), 43210);
  EXPECT_EQ(NumericAddress(v4), "127.0.0.1:43210");
  const sockaddr_storage v6 = SocketAddress(AF_INET6, "fe80::1", 29500);
  EXPECT_EQ(NumericHost(v6), "fe80::1");
  EXPECT_EQ(NumericPort(v6), 29500);
  EXPECT_EQ(NumericAddress(v6), "[fe80::1]:29500");
  // Read back by the parsers.
  EXPECT_EQ(HostOfAddress(NumericAddress(v6)), "fe80::1");
  EXPECT_EQ(PortOfAddress(NumericAddress(v6)), "29500");
}

TEST(AddressTest, OtherFamiliesHaveNoNumericForm) {
  sockaddr_storage unix_address{};
  unix_address.ss_family = AF_UNIX;
  EXPECT_EQ(NumericHost(unix_address), "");
  EXPECT_EQ(NumericPort(unix_address), 0);
  EXPECT_EQ(NumericAddress(unix_address), "");
}

TEST(AddressTest, CheckResolvesNamesTheHostThatDoesNot) {
  EXPECT_TRUE(CheckResolves("127.0.0.1").ok());
  EXPECT_TRUE(CheckResolves("localhost").ok());
  EXPECT_TRUE(CheckResolves("::1").ok());
  const Status bad = CheckResolves("nosuch.invalid");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_EQ(bad.message().substr(0, 33), "'nosuch.invalid' does not resolve");
  EXPECT_EQ(CheckResolves("").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lockstep
