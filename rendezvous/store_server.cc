#include "rendezvous/store_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace rendezvous {

StoreServer::StoreServer(std::shared_ptr<StoreCore> core)
    : core_(std::move(core)), service_(std::make_unique<StoreGrpcService>(core_.get())) {}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address,
                                                          std::shared_ptr<StoreCore> core) {
  if (core == nullptr) core = std::make_shared<StoreCore>();
  std::unique_ptr<StoreServer> server(new StoreServer(std::move(core)));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ConfigureStoreServerBuilder(&builder);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("store server could not bind ", address));
  }
  std::string host = address.substr(0, address.rfind(':'));
  server->address_ = absl::StrCat(host, ":", server->port_);
  return server;
}

StoreServer::~StoreServer() { Shutdown(); }

void StoreServer::Shutdown(Duration grace) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(grace));
  server_->Wait();
  server_.reset();
}

}  // namespace rendezvous
}  // namespace lockstep
