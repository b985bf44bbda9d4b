#include "rendezvous/grpc_status.h"

#include "absl/strings/str_cat.h"

namespace lockstep {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status StatusFromCode(int32_t code, const std::string& message) {
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(absl::StrCat("(code ", code, ") ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return StatusFromCode(static_cast<int32_t>(status.error_code()), status.error_message());
}

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& context) {
  if (status.ok()) return absl::OkStatus();
  return StatusFromCode(static_cast<int32_t>(status.error_code()),
                        absl::StrCat(context, ": ", status.error_message()));
}

}  // namespace lockstep
