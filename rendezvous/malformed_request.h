// Malformed requests get INVALID_ARGUMENT with a message.
//
// gRPC's callback API (1.51) answers a request whose bytes do not parse as
// the method's request message with UNIMPLEMENTED and an empty message
// (CallbackUnaryHandler::RunHandler in grpcpp/impl/codegen/
// server_callback_handlers.h), before any service code runs. This server
// interceptor rewrites exactly that answer, on the methods of the services
// it is given, into INVALID_ARGUMENT naming the method and the message type
// the bytes failed to parse as. A method the server does not serve keeps
// its UNIMPLEMENTED.
#ifndef LOCKSTEP_RENDEZVOUS_MALFORMED_REQUEST_H_
#define LOCKSTEP_RENDEZVOUS_MALFORMED_REQUEST_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace lockstep {
namespace rendezvous {

// `services`: full names of the protobuf services the server serves
// ("lockstep.v1.StoreService"), as their generated service_full_name().
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewMalformedRequestInterceptor(std::vector<std::string> services);

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_MALFORMED_REQUEST_H_
