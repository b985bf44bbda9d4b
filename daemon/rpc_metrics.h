// The gRPC server interceptor that feeds RpcStats (daemon_metrics.h): every
// call on a server built with it is timed from its interceptor's creation
// (the call's arrival) to the status being sent, and counted by method and
// status code. A call that ends without sending a status (the client went
// away) counts as CANCELLED when gRPC destroys it.
//
// Threading: interceptors run on gRPC's threads; RpcStats is thread-safe.
#ifndef LOCKSTEP_DAEMON_RPC_METRICS_H_
#define LOCKSTEP_DAEMON_RPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "daemon/daemon_metrics.h"

namespace lockstep {
namespace daemon {

// A factory for ServerBuilder::experimental().SetInterceptorCreators.
// `stats` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewRpcMetricsInterceptor(
    RpcStats* stats);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_RPC_METRICS_H_
