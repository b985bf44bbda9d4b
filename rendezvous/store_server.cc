#include "rendezvous/store_server.h"

#include "rendezvous/grpc_server.h"

namespace lockstep {
namespace rendezvous {

StoreServer::StoreServer(std::shared_ptr<StoreCore> core)
    : core_(std::move(core)), service_(std::make_unique<StoreGrpcService>(core_.get())) {}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address,
                                                          std::shared_ptr<StoreCore> core) {
  if (core == nullptr) core = std::make_shared<StoreCore>();
  std::unique_ptr<StoreServer> server(new StoreServer(std::move(core)));
  ASSIGN_OR_RETURN(StartedGrpcServer started,
                   StartGrpcServer(address, {server->service_.get()}, "store server"));
  {
    MutexLock lock(&server->shutdown_mu_);
    server->server_ = std::move(started.server);
  }
  server->port_ = started.port;
  server->address_ = std::move(started.address);
  return server;
}

StoreServer::~StoreServer() { Shutdown(); }

void StoreServer::Shutdown(Duration grace) {
  MutexLock lock(&shutdown_mu_);
  ShutdownGrpcServer(&server_, grace);
}

}  // namespace rendezvous
}  // namespace lockstep
