// Start and stop of the small embeddable gRPC servers (StoreServer,
// RendezvousServer): one place for the builder settings they share.
#ifndef LOCKSTEP_RENDEZVOUS_GRPC_SERVER_H_
#define LOCKSTEP_RENDEZVOUS_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace lockstep {
namespace rendezvous {

struct StartedGrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;  // host of the listen address + bound port
};

// Starts a server on `address` ("host:port", port 0 picks one) hosting
// `services` (not owned; must outlive the server), with health checking,
// reflection and the store's message-size limits. Unavailable, naming `what`
// and the address, if it cannot bind.
StatusOr<StartedGrpcServer> StartGrpcServer(const std::string& address,
                                            const std::vector<grpc::Service*>& services,
                                            const std::string& what);

// Shuts `*server` down (in-flight calls get `grace`), waits, and resets it.
// No-op when null.
void ShutdownGrpcServer(std::unique_ptr<grpc::Server>* server, Duration grace);

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_GRPC_SERVER_H_
