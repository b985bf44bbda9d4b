#include "common/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace {

// Position of the colon before the port, or npos.
std::string::size_type PortColon(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return std::string::npos;
    }
    return close + 1;
  }
  const auto colon = address.rfind(':');
  // More than one colon and no brackets: a bare IPv6 address.
  if (colon == std::string::npos || address.find(':') != colon) return std::string::npos;
  return colon;
}

}  // namespace

std::string HostOfAddress(const std::string& address) {
  const auto colon = PortColon(address);
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

std::string PortOfAddress(const std::string& address) {
  const auto colon = PortColon(address);
  return colon == std::string::npos ? "" : address.substr(colon + 1);
}

bool IsPort(const std::string& port) {
  if (port.empty() || port.size() > 5) return false;
  int number = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    number = number * 10 + (c - '0');
  }
  return number >= 1 && number <= 65535;
}

bool IsDialableAddress(const std::string& address) {
  const auto colon = PortColon(address);
  if (address.size() > kMaxAddressBytes || colon == std::string::npos) return false;
  if (!IsPort(address.substr(colon + 1))) return false;
  const bool bracketed = address.front() == '[';
  const std::string host = HostOfAddress(address);
  if (host.empty()) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || (bracketed && (c == ':' || c == '%'));
    if (!ok) return false;
  }
  return true;
}

Status CheckResolves(const std::string& host) {
  if (host.empty()) return absl::InvalidArgumentError("'' does not resolve: no host given");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", host, "' does not resolve: ", gai_strerror(rc)));
  }
  freeaddrinfo(found);
  return absl::OkStatus();
}

std::string NumericHost(const sockaddr_storage& address) {
  char buf[INET6_ADDRSTRLEN] = {0};
  const void* raw = nullptr;
  if (address.ss_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in&>(address).sin_addr;
  } else if (address.ss_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
  } else {
    return "";
  }
  if (inet_ntop(address.ss_family, raw, buf, sizeof(buf)) == nullptr) return "";
  return buf;
}

int NumericPort(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return 0;
}

std::string JoinHostPort(const std::string& host, const std::string& port) {
  const bool bare_v6 = host.find(':') != std::string::npos && host.front() != '[';
  return bare_v6 ? "[" + host + "]:" + port : host + ":" + port;
}

std::string NumericAddress(const sockaddr_storage& address) {
  const std::string host = NumericHost(address);
  if (host.empty()) return "";
  return JoinHostPort(host, std::to_string(NumericPort(address)));
}

}  // namespace lockstep
