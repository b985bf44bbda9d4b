// Start and stop of the project's gRPC servers (lockstepd, StoreServer): one
// place for the builder settings they share.
//
// No port is ever shared: gRPC sets SO_REUSEPORT by default on Linux, which
// lets a second server bind a port in use and take half its connections.
// Every server here turns it off, so binding a used port fails at once.
#ifndef LOCKSTEP_RENDEZVOUS_GRPC_SERVER_H_
#define LOCKSTEP_RENDEZVOUS_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

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

// Why binding `address` ("host:port") fails, found by binding it with a
// plain socket the way gRPC does ("Address already in use (another process
// listens there)"); empty when that bind succeeds.
std::string WhyCannotListen(const std::string& address);

// Starts a server on `address` ("host:port", port 0 picks one) hosting
// `services` (not owned; must outlive the server), with health checking,
// reflection, the process's transport security (rendezvous/tls.h: mutual
// TLS, or plaintext when ProcessTls() has none; the plaintext rule,
// CheckPlaintextAllowed, is the caller's), kMaxGrpcMessageBytes both ways
// (grpc_limits.h) and no port sharing; `interceptors` (Default: none) wrap every call, lockstepd's RPC
// metrics among them.
// Unavailable, naming `what`, the address and why (WhyCannotListen), if it
// cannot bind.
StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const std::string& what,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors = {});

// Shuts `*server` down (in-flight calls get `grace`), waits, and resets it.
// No-op when null.
void ShutdownGrpcServer(std::unique_ptr<grpc::Server>* server, Duration grace);

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_GRPC_SERVER_H_
