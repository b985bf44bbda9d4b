#include "common/address.h"

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

}  // namespace lockstep
