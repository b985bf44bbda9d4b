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
        absl::StrCat("'", host, "' does not resolve: ", gai_strerror(rc)));
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

// `status` (InvalidArgument from Resolve) with `what` before its message.
Status Named(const std::string& what, const Status& status) {
  return absl::Status(status.code(), absl::StrCat(what, " ", status.message()));
}

// The override (rule 1), checked here: Gloo resolves it itself, and one that
// does not resolve crashed the worker inside Gloo (SIGSEGV in
// CreateDeviceAttr) instead of failing.
Status CheckOverride(const std::string& host) {
  auto resolved = Resolve(host);
  if (resolved.ok()) return absl::OkStatus();
  std::string message =
      absl::StrCat("LOCKSTEP_GLOO_HOST (or InitOptions::gloo_hostname) ", resolved.status().message());
  const bool bare_name = host.find_first_of(".:") == std::string::npos;
  if (bare_name && if_nametoindex(host.c_str()) != 0) {
    absl::StrAppend(&message, "; it takes an address or host name, and '", host,
                    "' is a network interface here: set GLOO_SOCKET_IFNAME=", host,
                    " to bind that interface's address");
  } else if (bare_name) {
    absl::StrAppend(&message, "; it takes an address or host name (if '", host,
                    "' is a network interface, set GLOO_SOCKET_IFNAME=", host, " instead)");
  }
  return absl::InvalidArgumentError(message);
}

// The address of network interface `name` (GLOO_SOCKET_IFNAME, rule 2): its
// first IPv4 address, else its first IPv6 one that is not link-local (which
// would need a scope to bind).
StatusOr<std::string> AddressOfInterface(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string v4, v6, names;
  bool found = false;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_name == nullptr) continue;
    if (name != ifa->ifa_name) {
      if (names.find(absl::StrCat(" ", ifa->ifa_name, ",")) == std::string::npos) {
        absl::StrAppend(&names, " ", ifa->ifa_name, ",");
      }
      continue;
    }
    found = true;
    if (ifa->ifa_addr == nullptr) continue;
    const int family = ifa->ifa_addr->sa_family;
    sockaddr_storage ss{};
    if (family == AF_INET && v4.empty()) {
      std::memcpy(&ss, ifa->ifa_addr, sizeof(sockaddr_in));
      v4 = NumericHost(ss);
    } else if (family == AF_INET6 && v6.empty()) {
      std::memcpy(&ss, ifa->ifa_addr, sizeof(sockaddr_in6));
      if (!IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr)) {
        v6 = NumericHost(ss);
      }
    }
  }
  freeifaddrs(list);
  if (!found && if_nametoindex(name.c_str()) == 0) {
    if (!names.empty()) names.pop_back();  // the last ','
    return absl::InvalidArgumentError(absl::StrCat(
        "GLOO_SOCKET_IFNAME='", name, "' names no network interface of this host (it has:", names,
        ")"));
  }
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::InvalidArgumentError(
      absl::StrCat("GLOO_SOCKET_IFNAME='", name,
                   "': the interface has no IPv4 address and no IPv6 one that is not link-local"));
}

bool IsLoopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr) >> 24) == 127;
  }
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr);
}

}  // namespace

StatusOr<std::string> LocalAddressTowards(const std::string& host) {
  auto resolved = Resolve(host);
  if (!resolved.ok()) return Named("host", resolved.status());
  const auto& targets = *resolved;
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
  if (!in.override_host.empty()) {
    RETURN_IF_ERROR(CheckOverride(in.override_host));
    return DataPlaneAddress{in.override_host, in.socket_ifname.empty()
                                                  ? "override"
                                                  : "override, over GLOO_SOCKET_IFNAME"};
  }
  if (!in.socket_ifname.empty()) {
    // PyTorch takes a list (one Gloo device each); one device binds the first.
    const std::string ifname = in.socket_ifname.substr(0, in.socket_ifname.find(','));
    ASSIGN_OR_RETURN(std::string address, AddressOfInterface(ifname));
    return DataPlaneAddress{address, "GLOO_SOCKET_IFNAME"};
  }
  // Peer targets: where the other ranks are reached from here.
  std::vector<std::pair<std::string, const char*>> targets;
  if (!in.master_host.empty()) targets.emplace_back(in.master_host, "route to MASTER_ADDR");
  if (!in.store_host.empty()) targets.emplace_back(in.store_host, "route to LOCKSTEP_STORE");
  if (!in.node_addr.empty()) {
    auto resolved = Resolve(in.node_addr);
    if (!resolved.ok()) return Named("LOCKSTEP_NODE_ADDR", resolved.status());
    const auto& addrs = *resolved;
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
