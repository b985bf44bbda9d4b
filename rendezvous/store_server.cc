#include "rendezvous/store_server.h"

#include "rendezvous/grpc_server.h"
#include "rendezvous/malformed_request.h"

namespace lockstep {
namespace rendezvous {

StoreServer::StoreServer(std::shared_ptr<StoreCore> core, StoreAuthorizer authorizer)
    : core_(std::move(core)),
      service_(std::make_unique<StoreGrpcService>(core_.get(), std::move(authorizer))) {}

StoreAuthorizer StoreServer::BearerToken(std::string token) {
  return [want = "Bearer " + std::move(token)](
             const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
             absl::string_view) -> Status {
    auto it = metadata.find("authorization");
    if (it != metadata.end()) {
      const grpc::string_ref& got = it->second;
      // Constant time over the expected length: how far a guess matched
      // does not show in the time it takes.
      unsigned char diff = got.size() == want.size() ? 0 : 1;
      for (size_t i = 0; i < want.size(); ++i) {
        diff |= static_cast<unsigned char>(want[i] ^ (i < got.size() ? got.data()[i] : 0));
      }
      if (diff == 0) return absl::OkStatus();
    }
    return absl::UnauthenticatedError(
        "store: this store needs its token (LOCKSTEP_STORE_TOKEN, the same on every rank)");
  };
}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address,
                                                          std::shared_ptr<StoreCore> core,
                                                          StoreAuthorizer authorizer) {
  if (core == nullptr) core = std::make_shared<StoreCore>();
  std::unique_ptr<StoreServer> server(new StoreServer(std::move(core), std::move(authorizer)));
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(NewMalformedRequestInterceptor({v1::StoreService::service_full_name()}));
  ASSIGN_OR_RETURN(StartedGrpcServer started,
                   StartGrpcServer(address, {server->service_.get()}, "store server",
                                   std::move(interceptors)));
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
