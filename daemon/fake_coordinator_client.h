// CoordinatorClient fake for agent tests: records requests, answers with a
// programmable response, can fail every call. testonly. Thread-safe.
#ifndef LOCKSTEP_DAEMON_FAKE_COORDINATOR_CLIENT_H_
#define LOCKSTEP_DAEMON_FAKE_COORDINATOR_CLIENT_H_

#include <functional>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/coordinator_client.h"

namespace lockstep {
namespace daemon {

class FakeCoordinatorClient : public CoordinatorClient {
 public:
  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                  Duration) override {
    MutexLock lock(&mu_);
    registrations_.push_back(request);
    if (!fail_.ok()) return fail_;
    v1::RegisterNodeResponse resp;
    resp.set_lease_s(lease_s_);
    resp.set_heartbeat_interval_s(0.05);
    return resp;
  }
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                            Duration) override {
    std::function<void()> during;
    {
      MutexLock lock(&mu_);
      during = on_heartbeat_;
    }
    if (during) during();  // what happens while the RPC is in flight
    MutexLock lock(&mu_);
    heartbeats_.push_back(request);
    if (!fail_.ok()) return fail_;
    v1::HeartbeatResponse resp = response_;
    resp.set_lease_s(lease_s_);
    return resp;
  }

  void SetResponse(const v1::HeartbeatResponse& resp) {
    MutexLock lock(&mu_);
    response_ = resp;
  }
  // Runs `f` on the caller's thread at every Heartbeat, before it answers.
  void SetOnHeartbeat(std::function<void()> f) {
    MutexLock lock(&mu_);
    on_heartbeat_ = std::move(f);
  }
  void SetFailure(Status s) {
    MutexLock lock(&mu_);
    fail_ = std::move(s);
  }
  void SetLease(double s) {
    MutexLock lock(&mu_);
    lease_s_ = s;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() {
    MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<v1::RegisterNodeRequest> registrations() {
    MutexLock lock(&mu_);
    return registrations_;
  }

 private:
  Mutex mu_;
  v1::HeartbeatResponse response_ ABSL_GUARDED_BY(mu_);
  Status fail_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_heartbeat_ ABSL_GUARDED_BY(mu_);
  double lease_s_ ABSL_GUARDED_BY(mu_) = 10;
  std::vector<v1::HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterNodeRequest> registrations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_FAKE_COORDINATOR_CLIENT_H_
