// CoordinatorClient fake for agent tests: records requests, answers with a
// programmable response, can fail every call. testonly. Thread-safe.
#ifndef LOCKSTEP_DAEMON_FAKE_COORDINATOR_CLIENT_H_
#define LOCKSTEP_DAEMON_FAKE_COORDINATOR_CLIENT_H_

#include <mutex>
#include <vector>

#include "daemon/coordinator_client.h"

namespace lockstep {
namespace daemon {

class FakeCoordinatorClient : public CoordinatorClient {
 public:
  StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request,
                                                  Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    registrations_.push_back(request);
    if (!fail_.ok()) return fail_;
    v1::RegisterNodeResponse resp;
    resp.set_lease_s(lease_s_);
    resp.set_heartbeat_interval_s(0.05);
    return resp;
  }
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                            Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeats_.push_back(request);
    if (!fail_.ok()) return fail_;
    v1::HeartbeatResponse resp = response_;
    resp.set_lease_s(lease_s_);
    return resp;
  }

  void SetResponse(const v1::HeartbeatResponse& resp) {
    std::lock_guard<std::mutex> lock(mu_);
    response_ = resp;
  }
  void SetFailure(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = std::move(s);
  }
  void SetLease(double s) {
    std::lock_guard<std::mutex> lock(mu_);
    lease_s_ = s;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  std::vector<v1::RegisterNodeRequest> registrations() {
    std::lock_guard<std::mutex> lock(mu_);
    return registrations_;
  }

 private:
  std::mutex mu_;
  v1::HeartbeatResponse response_;
  Status fail_;
  double lease_s_ = 10;
  std::vector<v1::HeartbeatRequest> heartbeats_;
  std::vector<v1::RegisterNodeRequest> registrations_;
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_FAKE_COORDINATOR_CLIENT_H_
