#include "rendezvous/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/tls.h"

namespace lockstep {
namespace rendezvous {
namespace {

// Turns off SO_REUSEPORT for `builder`'s listening ports.
void DisallowPortSharing(grpc::ServerBuilder* builder) {
  // gRPC sets SO_REUSEPORT on Linux by default, so a second server on a
  // used port binds "successfully" and steals half the connections.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

// Bounds what clients can make the server hold (see grpc_limits.h).
void BoundResources(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  grpc::ResourceQuota quota("lockstep-server");
  quota.Resize(kGrpcMemoryBudgetBytes);
  builder->SetResourceQuota(quota);
}

}  // namespace

std::string WhyCannotListen(const std::string& address) {
  const std::string host = HostOfAddress(address);
  const std::string port = PortOfAddress(address);
  if (port.empty()) return "no port given (want host:port)";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(), port.c_str(),
                              &hints, &found);
  if (gai != 0) return absl::StrCat("cannot resolve '", host, "': ", gai_strerror(gai));
  std::string why;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // As gRPC does: SO_REUSEADDR lets a port in TIME_WAIT be reused, but
    // never one another socket listens on.
    int on = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      why = std::strerror(errno);
      if (errno == EADDRINUSE) why += " (another process listens there)";
      if (errno == EADDRNOTAVAIL) why += " (not an address of this host)";
    } else {
      why.clear();
    }
    close(fd);
    if (!why.empty()) break;
  }
  freeaddrinfo(found);
  return why;
}

StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const std::string& what,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  ApplyMessageLimits(&builder);
  BoundResources(&builder);
  DisallowPortSharing(&builder);
  StartedGrpcServer started;
  builder.AddListeningPort(address, LockstepServerCredentials(), &started.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (!interceptors.empty()) builder.experimental().SetInterceptorCreators(std::move(interceptors));
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    started.server.reset();
    std::string why = WhyCannotListen(address);
    if (why.empty()) why = "gRPC refused the address";
    return absl::UnavailableError(absl::StrCat(what, " cannot listen on ", address, ": ", why));
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
