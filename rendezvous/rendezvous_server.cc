#include "rendezvous/rendezvous_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

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
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ConfigureStoreServerBuilder(&builder);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(&server->rendezvous_service_);
  builder.RegisterService(&server->store_service_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("rendezvous server could not bind ", address));
  }
  server->address_ = absl::StrCat(address.substr(0, address.rfind(':')), ":", server->port_);
  return server;
}

RendezvousServer::~RendezvousServer() { Shutdown(); }

void RendezvousServer::Shutdown(Duration grace) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(grace));
  server_->Wait();
  server_.reset();
}

}  // namespace rendezvous
}  // namespace lockstep
