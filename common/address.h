// "host:port" addresses: the one parser every component uses.
#ifndef LOCKSTEP_COMMON_ADDRESS_H_
#define LOCKSTEP_COMMON_ADDRESS_H_

#include <sys/socket.h>

#include <cstddef>
#include <string>

#include "common/status.h"

namespace lockstep {

// The host of "host:port" or "[v6]:port" (brackets removed); `address`
// itself when it has no port (a bare IPv6 address has several colons).
std::string HostOfAddress(const std::string& address);

// The port of "host:port" or "[v6]:port"; "" when there is none.
std::string PortOfAddress(const std::string& address);

// Whether `port` is a TCP port to dial: 1-65535 in digits only.
bool IsPort(const std::string& port);

// The longest address IsDialableAddress accepts.
inline constexpr size_t kMaxAddressBytes = 256;

// Whether `address` is one a peer can dial: "host:port" or "[v6]:port",
// with a port of 1-65535 in digits and a host of address characters only
// (letters, digits, '.', '-', '_'; ':' and '%' too inside brackets); at
// most kMaxAddressBytes.
bool IsDialableAddress(const std::string& address);

// Whether `host` (a name or a numeric address, without brackets) resolves
// to an address (getaddrinfo; blocks on name resolution, which a resolver
// may stretch to seconds). Errors: InvalidArgument "'host' does not
// resolve: <the resolver's reason>", for an empty host too.
Status CheckResolves(const std::string& host);

// "host:port", with an IPv6 host bracketed ("[fd00::1]:29500"), so that
// HostOfAddress and PortOfAddress read it back. A host already bracketed,
// or empty, is taken as is.
std::string JoinHostPort(const std::string& host, const std::string& port);

// The numeric host of a socket address ("127.0.0.1", "::1"); "" for a
// family other than AF_INET and AF_INET6.
std::string NumericHost(const sockaddr_storage& address);

// The port of a socket address in host byte order; 0 for a family other
// than AF_INET and AF_INET6.
int NumericPort(const sockaddr_storage& address);

// The numeric "host:port" of a socket address ("127.0.0.1:43210",
// "[::1]:43210"), as HostOfAddress and PortOfAddress read it back; "" for a
// family other than AF_INET and AF_INET6.
std::string NumericAddress(const sockaddr_storage& address);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_ADDRESS_H_
