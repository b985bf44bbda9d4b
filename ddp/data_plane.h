// Which local address a worker's data plane binds: the Gloo pairs, the
// shm+gloo leaders and NCCL's bootstrap socket. Plain sockets, no LibTorch.
//
// The rule (first that applies):
//   1. an explicit override (InitOptions::gloo_hostname, or
//      LOCKSTEP_GLOO_HOST in the worker's environment): an address or a host
//      name, which must resolve;
//   2. GLOO_SOCKET_IFNAME (torchrun's habit): the IPv4 address of that
//      network interface, else its IPv6 address that is not link-local; of
//      a comma-separated list, the first (one Gloo device binds one
//      address). Rule 1 wins when both are set;
//   3. the node's own address, which lockstepd's agent hands its workers as
//      LOCKSTEP_NODE_ADDR (the host of its advertised address), unless it
//      resolves to loopback while a peer target (below) is not loopback: a
//      host name that /etc/hosts maps to 127.0.1.1 is no address for peers;
//   4. the local address of the route to MASTER_ADDR (a hand-started
//      worker, torchrun-style), then to LOCKSTEP_STORE's host;
//   5. 127.0.0.1.
// So a multi-host job needs no setting: each worker binds the address its
// peers reach it at.
//
// Thread safety: every function is thread-safe. Each may block on name
// resolution (getaddrinfo).
#ifndef LOCKSTEP_DDP_DATA_PLANE_H_
#define LOCKSTEP_DDP_DATA_PLANE_H_

#include <string>

#include "common/status.h"

namespace lockstep {
namespace ddp {

struct DataPlaneInputs {
  std::string override_host;  // rule 1
  std::string socket_ifname;  // rule 2 (GLOO_SOCKET_IFNAME)
  std::string node_addr;      // rule 3 (LOCKSTEP_NODE_ADDR)
  std::string master_host;    // rule 4 (MASTER_ADDR)
  std::string store_host;     // rule 4 (host of LOCKSTEP_STORE=host:port)
};

struct DataPlaneAddress {
  std::string address;  // numeric, or the override exactly as given
  std::string source;   // which rule chose it, for the log ("LOCKSTEP_NODE_ADDR", ...)
};

// Applies the rule above. Errors: InvalidArgument naming the variable and
// its value when the override or LOCKSTEP_NODE_ADDR does not resolve ("...
// does not resolve: ..."; for an override that is a bare name, saying that
// LOCKSTEP_GLOO_HOST takes an address or host name and GLOO_SOCKET_IFNAME
// an interface), or when GLOO_SOCKET_IFNAME names no interface of this host
// (the message lists those it has) or one without a usable address.
StatusOr<DataPlaneAddress> ChooseDataPlaneAddress(const DataPlaneInputs& inputs);

// The local address the kernel would send from to reach `host` (a UDP
// socket connected to it and read back; no packet is sent). IPv4 preferred.
// Errors: InvalidArgument (does not resolve), Unavailable (no route).
StatusOr<std::string> LocalAddressTowards(const std::string& host);

// Whether `host` resolves to a loopback address (127/8, ::1).
bool ResolvesToLoopback(const std::string& host);

// The network interface holding `address` ("eth0"), or "" if none does.
std::string InterfaceOf(const std::string& address);

}  // namespace ddp
}  // namespace lockstep

#endif  // LOCKSTEP_DDP_DATA_PLANE_H_
