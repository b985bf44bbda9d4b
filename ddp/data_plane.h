// Which local address a worker's data plane binds: the Gloo pairs, the
// shm+gloo leaders and NCCL's bootstrap socket. Plain sockets, no LibTorch.
//
// The rule (first that applies):
//   1. an explicit override (InitOptions::gloo_hostname, or
//      LOCKSTEP_GLOO_HOST in the worker's environment);
//   2. the node's own address, which lockstepd's agent hands its workers as
//      LOCKSTEP_NODE_ADDR (the host of its advertised address), unless it
//      resolves to loopback while a peer target (below) is not loopback: a
//      host name that /etc/hosts maps to 127.0.1.1 is no address for peers;
//   3. the local address of the route to MASTER_ADDR (a hand-started
//      worker, torchrun-style), then to LOCKSTEP_STORE's host;
//   4. 127.0.0.1.
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
  std::string node_addr;      // rule 2 (LOCKSTEP_NODE_ADDR)
  std::string master_host;    // rule 3 (MASTER_ADDR)
  std::string store_host;     // rule 3 (host of LOCKSTEP_STORE=host:port)
};

struct DataPlaneAddress {
  std::string address;  // numeric, or the override exactly as given
  std::string source;   // which rule chose it, for the log ("LOCKSTEP_NODE_ADDR", ...)
};

// Applies the rule above. Errors: InvalidArgument when LOCKSTEP_NODE_ADDR
// (or the override) names a host that does not resolve.
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
