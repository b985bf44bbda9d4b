// StoreGrpcService: the thin gRPC shell over StoreCore (lockstep.v1.StoreService).
// Per RPC it validates, converts proto to domain types, calls the core and
// maps the status through rendezvous/grpc_status.h. It holds no state beyond a
// pointer to the core (the Session reactor keeps only its stream's queue).
//
// Threading: gRPC's callback API. Handlers run on gRPC's callback threads and
// never block: core calls are short critical sections. Blocking operations
// (Get, Wait, MultiGet; unary or on a Session stream) register a waiter with
// StoreCore::WaitAsync and return; the reactor is completed from the core's
// callback, on the thread of the write that satisfied the wait or on the
// core's expiry thread at the deadline. So a thousand parked waits hold no
// server thread. A client that disconnects mid-wait triggers OnCancel /
// a failed read, which cancels its waiters in the core.
//
// Timeouts: a request's timeout_ms bounds the wait (0 = do not wait:
// DeadlineExceeded at once if a key is missing; negative = InvalidArgument;
// above kMaxStoreWait it is clamped to kMaxStoreWait, so no value overflows
// into an instant deadline); the RPC's own deadline, when earlier, bounds it
// too.
//
// Authorization: an optional StoreAuthorizer (Default: none, the service is
// open, as in tests, benches and standalone servers). When set, every unary
// RPC is checked against (the call's client metadata, the request's
// namespace) before it touches the core, and fails with the authorizer's
// status (Unauthenticated / PermissionDenied). On a Session stream each op is
// checked against the metadata sent at stream start and the op's namespace;
// a refused op fails alone (its StoreOpResult carries the code and message),
// the stream and the client's other ops go on. The stream itself is checked
// first, when it opens, against the job its client names in
// kStoreJobMetadata (store.h): a stream refused there is finished at once
// with the authorizer's status, so a caller without a valid token holds no
// stream, no reactor and no read buffer (1,000 such streams leave nothing
// behind: store_service_test). Refusals are logged (refusals.h), those of
// Session ops at most every 10 s.
//
// Resources: live Session streams are capped per job (kMaxSessionsPerJob)
// and in all (kMaxSessions): one more is finished at open with
// ResourceExhausted naming the limit. Parked waits are capped in the core
// (kMaxWaitersPerJob, kMaxWaitersTotal). A Session whose client does not
// read its results stops reading ops once kMaxQueuedResults results wait to
// be written, and reads again when half have gone, so a stalled client
// holds at most that many results; HTTP/2 flow control holds back the rest.
// A client that goes away releases its parked waits and its slot.
//
// Malformed ops: the Session method is served raw (ByteBuffers; its wire
// format is StoreOp / StoreOpResult as store.proto says) and the reactor
// parses each op itself, because gRPC reports bytes that do not parse as a
// StoreOp exactly as it reports the client's end of the stream (a failed
// read). Such bytes end the stream, once the results of the ops before them
// are written, with INVALID_ARGUMENT naming lockstep.v1.StoreOp; the
// client's end of the stream ends it with OK.
//
// Message size: values may be up to kMaxValueBytes, so servers hosting this
// service must raise gRPC's 4 MiB default: call ApplyMessageLimits()
// (rendezvous/grpc_limits.h).
//
// Usage, on a server of your own (the coordinator):
//   auto core = std::make_shared<StoreCore>();
//   StoreGrpcService store_service(core.get());
//   grpc::ServerBuilder builder;
//   ApplyMessageLimits(&builder);
//   builder.RegisterService(&store_service);
#ifndef LOCKSTEP_RENDEZVOUS_STORE_SERVICE_H_
#define LOCKSTEP_RENDEZVOUS_STORE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/status.h"

#include "lockstep/v1/store.grpc.pb.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/store_core.h"

namespace lockstep {
namespace rendezvous {

// Live Session streams per job (the job its client names at open, "<job>" of
// "<job>/..." as authorization reads it; "" for a client that names none)
// and in all. A job holds one per rank.
inline constexpr int kMaxSessionsPerJob = 16384;
inline constexpr int kMaxSessions = 65536;
// Results one Session may have waiting to be written before it stops
// reading ops (see "Resources").
inline constexpr size_t kMaxQueuedResults = 1024;

// The wait of a store request's timeout_ms: InvalidArgument naming
// timeout_ms when negative; clamped to kMaxStoreWait.
StatusOr<Duration> StoreWaitTimeout(int64_t timeout_ms);

// Decides whether a caller may use namespace `ns`. Must be thread-safe and
// must not block: it runs on gRPC's callback threads.
using StoreAuthorizer = std::function<Status(
    const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata, absl::string_view ns)>;

// The generated CallbackService with Session raw (see "Malformed ops").
using StoreCallbackServiceBase = v1::StoreService::WithCallbackMethod_Set<
    v1::StoreService::WithCallbackMethod_Get<v1::StoreService::WithCallbackMethod_Add<
        v1::StoreService::WithCallbackMethod_CompareSet<v1::StoreService::WithCallbackMethod_Delete<
            v1::StoreService::WithCallbackMethod_Wait<v1::StoreService::WithCallbackMethod_NumKeys<
                v1::StoreService::WithCallbackMethod_MultiGet<
                    v1::StoreService::WithCallbackMethod_MultiSet<
                        v1::StoreService::WithRawCallbackMethod_Session<
                            v1::StoreService::Service>>>>>>>>>>;

class StoreGrpcService final : public StoreCallbackServiceBase {
 public:
  // See "Resources" above; tests lower them.
  struct Limits {
    int max_sessions_per_job = kMaxSessionsPerJob;
    int max_sessions = kMaxSessions;
    size_t max_queued_results = kMaxQueuedResults;
  };

  // `core` is not owned and must outlive the service and the server.
  // `authorizer`: see "Authorization" above; empty = open.
  explicit StoreGrpcService(StoreCore* core, StoreAuthorizer authorizer = nullptr)
      : StoreGrpcService(core, std::move(authorizer), Limits()) {}
  StoreGrpcService(StoreCore* core, StoreAuthorizer authorizer, Limits limits)
      : core_(core), authorizer_(std::move(authorizer)), limits_(limits) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx,
                                const v1::StoreSetRequest* request,
                                v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const v1::StoreGetRequest* request,
                                v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx,
                                const v1::StoreAddRequest* request,
                                v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const v1::StoreCompareSetRequest* request,
                                       v1::StoreCompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const v1::StoreDeleteRequest* request,
                                   v1::StoreDeleteResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const v1::StoreWaitRequest* request,
                                 v1::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx,
                                    const v1::StoreNumKeysRequest* request,
                                    v1::StoreNumKeysResponse* response) override;
  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx,
                                     const v1::StoreMultiGetRequest* request,
                                     v1::StoreMultiGetResponse* response) override;
  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* ctx,
                                     const v1::StoreMultiSetRequest* request,
                                     v1::StoreMultiSetResponse* response) override;
  // StoreOps in, StoreOpResults out, as bytes (see "Malformed ops").
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;

  // Live Session streams (refused ones never count); for tests and status.
  int NumSessions() const;

  // A Session's hold on its job's and the global stream count; released
  // when the stream's reactor is deleted.
  class SessionSlot;

 private:
  // OK when no authorizer is set.
  Status Authorize(const grpc::CallbackServerContext& ctx, absl::string_view ns) const;
  // Takes a slot for a stream of `job` (ResourceExhausted beyond the caps).
  StatusOr<std::unique_ptr<SessionSlot>> AcquireSessionSlot(const std::string& job);
  void ReleaseSessionSlot(const std::string& job);

  StoreCore* const core_;
  const StoreAuthorizer authorizer_;
  const Limits limits_;
  mutable Mutex sessions_mu_;
  std::unordered_map<std::string, int> sessions_by_job_ ABSL_GUARDED_BY(sessions_mu_);
  int sessions_ ABSL_GUARDED_BY(sessions_mu_) = 0;
  // A refused op on a Session stream (its namespace's token, a quota) is
  // logged at most every 10 s over all of this service's streams: a worker
  // may retry one in a loop.
  RateLimiter refused_op_log_{std::chrono::seconds(10)};
};

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_STORE_SERVICE_H_
