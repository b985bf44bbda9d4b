#include "rendezvous/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/store_service.h"

namespace lockstep {
namespace rendezvous {

StatusOr<StartedGrpcServer> StartGrpcServer(const std::string& address,
                                            const std::vector<grpc::Service*>& services,
                                            const std::string& what) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ConfigureStoreServerBuilder(&builder);
  StartedGrpcServer started;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &started.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(absl::StrCat(what, " could not bind ", address));
  }
  started.address = absl::StrCat(address.substr(0, address.rfind(':')), ":", started.port);
  return started;
}

void ShutdownGrpcServer(std::unique_ptr<grpc::Server>* server, Duration grace) {
  if (*server == nullptr) return;
  (*server)->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(grace));
  (*server)->Wait();
  server->reset();
}

}  // namespace rendezvous
}  // namespace lockstep
