#include "rendezvous/rendezvous_server.h"

#include "rendezvous/grpc_server.h"

namespace lockstep {
namespace rendezvous {

RendezvousServer::RendezvousServer(std::shared_ptr<RendezvousCore> rendezvous,
                                   std::shared_ptr<StoreCore> store)
    : rendezvous_(std::move(rendezvous)),
      store_(std::move(store)),
      rendezvous_service_(rendezvous_.get()),
      store_service_(store_.get()) {}

StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& address, std::shared_ptr<RendezvousCore> rendezvous,
    std::shared_ptr<StoreCore> store) {
  if (rendezvous == nullptr) rendezvous = std::make_shared<RendezvousCore>();
  if (store == nullptr) store = std::make_shared<StoreCore>();
  std::unique_ptr<RendezvousServer> server(
      new RendezvousServer(std::move(rendezvous), std::move(store)));
  ASSIGN_OR_RETURN(StartedGrpcServer started,
                   StartGrpcServer(address, {&server->rendezvous_service_, &server->store_service_}, "rendezvous server"));
  server->server_ = std::move(started.server);
  server->port_ = started.port;
  server->address_ = std::move(started.address);
  return server;
}

RendezvousServer::~RendezvousServer() { Shutdown(); }

void RendezvousServer::Shutdown(Duration grace) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  ShutdownGrpcServer(&server_, grace);
}

}  // namespace rendezvous
}  // namespace lockstep
