// "host:port" addresses: the one parser every component uses.
#ifndef LOCKSTEP_COMMON_ADDRESS_H_
#define LOCKSTEP_COMMON_ADDRESS_H_

#include <string>

namespace lockstep {

// The host of "host:port" or "[v6]:port" (brackets removed); `address`
// itself when it has no port (a bare IPv6 address has several colons).
std::string HostOfAddress(const std::string& address);

// The port of "host:port" or "[v6]:port"; "" when there is none.
std::string PortOfAddress(const std::string& address);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_ADDRESS_H_
