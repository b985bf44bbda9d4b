// RendezvousServer: an embeddable gRPC server hosting RendezvousGrpcService
// and StoreGrpcService together: the bootstrap half of a coordinator, for
// tests, benches and single-host tools. (lockstepd's coordinator registers
// the two services on its own server instead.)
//
//   auto rdzv = std::make_shared<RendezvousCore>();
//   rdzv->CreateJob(config);
//   ASSIGN_OR_RETURN(auto server, RendezvousServer::Start("127.0.0.1:0", rdzv));
//   RendezvousClient::Connect(server->address(), ...);
//   ConnectStore(server->address(), result.store_namespace, ...);
//
// Also serves gRPC health checking and server reflection.
// Thread safety: all methods are safe to call concurrently.
#ifndef LOCKSTEP_RENDEZVOUS_RENDEZVOUS_SERVER_H_
#define LOCKSTEP_RENDEZVOUS_RENDEZVOUS_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "rendezvous/rendezvous_core.h"
#include "rendezvous/rendezvous_service.h"
#include "rendezvous/store_core.h"
#include "rendezvous/store_service.h"

namespace lockstep {
namespace rendezvous {

class RendezvousServer {
 public:
  // Binds `address` (port 0 picks a free one) and serves both services.
  // Null cores default to new ones on the real clock.
  // Errors: Unavailable if the address cannot be bound.
  static StatusOr<std::unique_ptr<RendezvousServer>> Start(
      const std::string& address, std::shared_ptr<RendezvousCore> rendezvous = nullptr,
      std::shared_ptr<StoreCore> store = nullptr);

  ~RendezvousServer();

  // Stops serving; in-flight joins and waits are cancelled after `grace`.
  // Idempotent.
  void Shutdown(Duration grace = std::chrono::milliseconds(200));

  int port() const { return port_; }
  const std::string& address() const { return address_; }
  RendezvousCore* rendezvous_core() const { return rendezvous_.get(); }
  StoreCore* store_core() const { return store_.get(); }

 private:
  RendezvousServer(std::shared_ptr<RendezvousCore> rendezvous, std::shared_ptr<StoreCore> store);

  std::shared_ptr<RendezvousCore> rendezvous_;
  std::shared_ptr<StoreCore> store_;
  RendezvousGrpcService rendezvous_service_;
  StoreGrpcService store_service_;
  std::mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_;  // GUARDED_BY(shutdown_mu_) after Start
  int port_ = 0;
  std::string address_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_RENDEZVOUS_SERVER_H_
