// StoreServer: an embeddable gRPC server hosting StoreGrpcService over a
// StoreCore, for tests, benches and tools. (The coordinator registers
// StoreGrpcService on its own server instead; see store_service.h.)
//
//   ASSIGN_OR_RETURN(auto server, StoreServer::Start("127.0.0.1:0"));
//   ConnectStore(server->address(), "job/1", std::chrono::seconds(5));
//
// Also serves gRPC health checking and server reflection.
// Thread safety: all methods are safe to call concurrently.
#ifndef LOCKSTEP_RENDEZVOUS_STORE_SERVER_H_
#define LOCKSTEP_RENDEZVOUS_STORE_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "common/status.h"
#include "rendezvous/store_core.h"
#include "rendezvous/store_service.h"

namespace lockstep {
namespace rendezvous {

class StoreServer {
 public:
  // Binds `address` ("host:port"; port 0 picks a free one, read it back with
  // port()) and starts serving. `core` may be shared with in-process users;
  // Default (nullptr): a new core on the real clock. `authorizer`: see
  // store_service.h; empty = open (tests, loopback), or BearerToken().
  // Errors: Unavailable if the address cannot be bound.
  static StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& address,
                                                      std::shared_ptr<StoreCore> core = nullptr,
                                                      StoreAuthorizer authorizer = nullptr);

  // An authorizer that admits a call whose `authorization` metadata is
  // "Bearer <token>" (compared in constant time), for every namespace;
  // others get Unauthenticated naming the store. `token` must not be empty.
  static StoreAuthorizer BearerToken(std::string token);

  // Shuts down (see Shutdown).
  ~StoreServer();

  // Stops accepting calls and cancels in-flight ones after `grace`; parked
  // waits are cancelled in the core. Idempotent. Blocks up to `grace` plus
  // the time handlers take to return.
  void Shutdown(Duration grace = std::chrono::milliseconds(200));

  int port() const { return port_; }
  // "<host>:<port>" with the bound port, ready for ConnectStore.
  const std::string& address() const { return address_; }
  StoreCore* core() const { return core_.get(); }

 private:
  StoreServer(std::shared_ptr<StoreCore> core, StoreAuthorizer authorizer);

  std::shared_ptr<StoreCore> core_;
  std::unique_ptr<StoreGrpcService> service_;
  // Held through a shutdown, so concurrent Shutdown calls wait for the first.
  Mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(shutdown_mu_);
  int port_ = 0;
  std::string address_;
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_STORE_SERVER_H_
