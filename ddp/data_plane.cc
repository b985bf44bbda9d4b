#include "ddp/data_plane.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/address.h"

namespace lockstep {
namespace ddp {
namespace {

// Resolved addresses of `host`, IPv4 first.
StatusOr<std::vector<sockaddr_storage>> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), "9", &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host '", host, "' does not resolve: ", gai_strerror(rc)));
  }
  std::vector<sockaddr_storage> v4, v6;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    (ai->ai_family == AF_INET ? v4 : v6).push_back(ss);
  }
  freeaddrinfo(found);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

bool IsLoopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr) >> 24) == 127;
  }
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr);
}

}  // namespace

StatusOr<std::string> LocalAddressTowards(const std::string& host) {
  ASSIGN_OR_RETURN(auto targets, Resolve(host));
  std::string last_error = "no address";
  for (const auto& target : targets) {
    const int fd = socket(target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const socklen_t len =
        target.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&target), len) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0;
    if (!ok) last_error = std::strerror(errno);
    close(fd);
    if (ok) return NumericHost(local);
  }
  return absl::UnavailableError(absl::StrCat("no route to '", host, "': ", last_error));
}

bool ResolvesToLoopback(const std::string& host) {
  auto addrs = Resolve(host);
  return addrs.ok() && !addrs->empty() && IsLoopback(addrs->front());
}

std::string InterfaceOf(const std::string& address) {
  auto wanted = Resolve(address);
  if (!wanted.ok() || wanted->empty()) return "";
  const std::string numeric = NumericHost(wanted->front());
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* ifa = list; ifa != nullptr && name.empty(); ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    const int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    sockaddr_storage ss{};
    std::memcpy(&ss, ifa->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (NumericHost(ss) == numeric) name = ifa->ifa_name;
  }
  freeifaddrs(list);
  return name;
}

StatusOr<DataPlaneAddress> ChooseDataPlaneAddress(const DataPlaneInputs& in) {
  if (!in.override_host.empty()) return DataPlaneAddress{in.override_host, "override"};
  // Peer targets: where the other ranks are reached from here.
  std::vector<std::pair<std::string, const char*>> targets;
  if (!in.master_host.empty()) targets.emplace_back(in.master_host, "route to MASTER_ADDR");
  if (!in.store_host.empty()) targets.emplace_back(in.store_host, "route to LOCKSTEP_STORE");
  if (!in.node_addr.empty()) {
    ASSIGN_OR_RETURN(auto addrs, Resolve(in.node_addr));
    bool peers_off_host = false;
    for (const auto& [host, why] : targets) peers_off_host |= !ResolvesToLoopback(host);
    if (!IsLoopback(addrs.front()) || !peers_off_host) {
      return DataPlaneAddress{NumericHost(addrs.front()), "LOCKSTEP_NODE_ADDR"};
    }
  }
  for (const auto& [host, why] : targets) {
    auto local = LocalAddressTowards(host);
    if (local.ok()) return DataPlaneAddress{*local, why};
  }
  return DataPlaneAddress{"127.0.0.1", "default"};
}

}  // namespace ddp
}  // namespace lockstep
