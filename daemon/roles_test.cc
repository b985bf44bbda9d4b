// The role table: every RPC of every service against every role.
#include "daemon/roles.h"

#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include <google/protobuf/descriptor.h>

#include "daemon/token.h"
#include "lockstep/v1/agent.pb.h"
#include "lockstep/v1/common.pb.h"
#include "lockstep/v1/coordinator.pb.h"
#include "lockstep/v1/store.pb.h"

namespace lockstep {
namespace daemon {
namespace {

constexpr char kAdmin[] = "admin-secret";
constexpr char kViewer[] = "viewer-secret";
constexpr char kAgent[] = "agent-secret";

class RolesTest : public ::testing::Test {
 protected:
  RolesTest() {
    roles_.SetToken(Role::kAdmin, kAdmin);
    roles_.SetToken(Role::kViewer, kViewer);
    roles_.SetToken(Role::kAgent, kAgent);
  }
  RoleTokens roles_;
};

// Written out here, not read from the table, so a table change that breaks
// the contract fails this test.
const std::map<std::string, std::set<Role>>& Expected() {
  static const auto* m = new std::map<std::string, std::set<Role>>{
      {"CoordinatorService/RegisterNode", {Role::kAdmin, Role::kAgent}},
      {"CoordinatorService/Heartbeat", {Role::kAdmin, Role::kAgent}},
      {"CoordinatorService/SubmitJob", {Role::kAdmin}},
      {"CoordinatorService/CancelJob", {Role::kAdmin}},
      {"CoordinatorService/DeleteJob", {Role::kAdmin}},
      {"CoordinatorService/GetJob", {Role::kAdmin, Role::kViewer}},
      {"CoordinatorService/ListJobs", {Role::kAdmin, Role::kViewer}},
      {"CoordinatorService/ListNodes", {Role::kAdmin, Role::kViewer}},
      {"CoordinatorService/WatchJob", {Role::kAdmin, Role::kViewer}},
      {"CoordinatorService/IssueLogTickets", {Role::kAdmin, Role::kViewer}},
      {"AgentService/ListWorkers", {Role::kLogTicket}},
      {"AgentService/ReadLogs", {Role::kLogTicket}},
      {"AgentService/ReportProgress", {Role::kWorker}},
      {"StoreService/Set", {Role::kAdmin, Role::kWorker}},
      {"StoreService/Get", {Role::kAdmin, Role::kWorker}},
      {"StoreService/Add", {Role::kAdmin, Role::kWorker}},
      {"StoreService/CompareSet", {Role::kAdmin, Role::kWorker}},
      {"StoreService/Delete", {Role::kAdmin, Role::kWorker}},
      {"StoreService/Wait", {Role::kAdmin, Role::kWorker}},
      {"StoreService/NumKeys", {Role::kAdmin, Role::kWorker}},
      {"StoreService/MultiGet", {Role::kAdmin, Role::kWorker}},
      {"StoreService/MultiSet", {Role::kAdmin, Role::kWorker}},
      {"StoreService/Session", {Role::kAdmin, Role::kWorker}},
  };
  return *m;
}

// Every "Service/Method" the protos define.
std::set<std::string> ProtoMethods() {
  std::set<std::string> out;
  const google::protobuf::FileDescriptor* files[] = {
      v1::SubmitJobRequest::descriptor()->file(),
      v1::ReadLogsRequest::descriptor()->file(),
      v1::StoreSetRequest::descriptor()->file(),
  };
  for (const auto* file : files) {
    for (int i = 0; i < file->service_count(); ++i) {
      const auto* service = file->service(i);
      for (int j = 0; j < service->method_count(); ++j) {
        out.insert(std::string(service->name()) + "/" + std::string(service->method(j)->name()));
      }
    }
  }
  return out;
}

TEST_F(RolesTest, TableListsEveryRpcOfEveryServiceAndNothingElse) {
  std::set<std::string> table;
  for (const auto& m : TableMethods()) table.insert(m);
  EXPECT_EQ(table, ProtoMethods());
  std::set<std::string> expected;
  for (const auto& [m, allowed] : Expected()) expected.insert(m);
  EXPECT_EQ(table, expected);
  for (const auto& [method, want] : Expected()) {
    auto got = MethodRoles(method);
    ASSERT_TRUE(got.has_value()) << method;
    EXPECT_EQ(std::set<Role>(got->begin(), got->end()), want) << method;
  }
}

TEST_F(RolesTest, EveryBearerRpcAgainstEveryRole) {
  const std::map<Role, std::string> tokens = {
      {Role::kAdmin, kAdmin}, {Role::kViewer, kViewer}, {Role::kAgent, kAgent}};
  for (const auto& [method, allowed] : Expected()) {
    if (method.rfind("StoreService/", 0) == 0 || method == "AgentService/ReportProgress") continue;
    for (const auto& [role, token] : tokens) {
      Status s = AuthorizeRpc(roles_, method, "Bearer " + token, true);
      if (allowed.count(role)) {
        EXPECT_TRUE(s.ok()) << RoleName(role) << " " << method << ": " << s;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << RoleName(role) << " " << method;
        EXPECT_NE(s.message().find(std::string(RoleName(role)) + " token cannot " +
                                   method.substr(method.find('/') + 1) + " (needs "),
                  absl::string_view::npos)
            << s;
      }
    }
    // A worker's credentials are no role's token.
    Status s = AuthorizeRpc(roles_, method, "Bearer " + JobStoreToken(kAdmin, "job-1"), true);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << method << ": " << s;
    EXPECT_EQ(AuthorizeRpc(roles_, method, "Bearer pt-progress", true).code(),
              absl::StatusCode::kUnauthenticated)
        << method;
    EXPECT_EQ(AuthorizeRpc(roles_, method, "", false).code(), absl::StatusCode::kUnauthenticated)
        << method;
    EXPECT_EQ(AuthorizeRpc(roles_, method, "Basic " + std::string(kAdmin), true).code(),
              absl::StatusCode::kUnauthenticated)
        << method;
    EXPECT_EQ(AuthorizeRpc(roles_, method, "Bearer ", true).code(),
              absl::StatusCode::kUnauthenticated)
        << method;
  }
}

TEST_F(RolesTest, ViewerCancelIsRefusedNamingBothRoles) {
  Status s = AuthorizeRpc(roles_, "CoordinatorService/CancelJob", "Bearer viewer-secret", true);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "a viewer token cannot CancelJob (needs admin)");
  s = AuthorizeRpc(roles_, "CoordinatorService/GetJob", "Bearer agent-secret", true);
  EXPECT_EQ(s.message(), "an agent token cannot GetJob (needs admin or viewer)");
}

TEST_F(RolesTest, MethodMissingFromTheTableIsRefusedEvenToAdmin) {
  Status s = AuthorizeRpc(roles_, "CoordinatorService/DropAllJobs", "Bearer admin-secret", true);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("not in the role table"), absl::string_view::npos) << s;
  EXPECT_FALSE(MethodRoles("CoordinatorService/DropAllJobs").has_value());
}

TEST_F(RolesTest, StoreAdmitsAdminAndTheJobsStoreTokenOnly) {
  const std::string key = "store-key";
  EXPECT_TRUE(AuthorizeStoreCall(roles_, key, "Bearer admin-secret", true, "job-1/0").ok());
  const std::string worker = "Bearer " + JobStoreToken(key, "job-1");
  EXPECT_TRUE(AuthorizeStoreCall(roles_, key, worker, true, "job-1/0").ok());
  EXPECT_EQ(AuthorizeStoreCall(roles_, key, worker, true, "job-2/0").code(),
            absl::StatusCode::kPermissionDenied);
  for (const char* t : {kViewer, kAgent}) {
    Status s = AuthorizeStoreCall(roles_, key, std::string("Bearer ") + t, true, "job-1/0");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << t;
    EXPECT_NE(s.message().find("token cannot use the store"), absl::string_view::npos) << s;
  }
  EXPECT_EQ(AuthorizeStoreCall(roles_, key, "", false, "job-1/0").code(),
            absl::StatusCode::kUnauthenticated);
  // A job's store token does not change when the admin token rotates.
  roles_.SetTokens(Role::kAdmin, {"admin-2"});
  EXPECT_TRUE(AuthorizeStoreCall(roles_, key, worker, true, "job-1/0").ok());
  EXPECT_TRUE(AuthorizeStoreCall(roles_, key, "Bearer admin-2", true, "job-9/0").ok());
  EXPECT_EQ(AuthorizeStoreCall(roles_, key, "Bearer admin-secret", true, "job-1/0").code(),
            absl::StatusCode::kPermissionDenied);
}

// A job's token opens its namespaces only while job_open says the job runs
// (lockstepd passes the coordinator's CheckStoreOpen); the admin's always.
TEST_F(RolesTest, AJobsStoreTokenIsRefusedOnceTheJobEnded) {
  const std::string key = "store-key";
  const std::string worker = "Bearer " + JobStoreToken(key, "job-1");
  std::vector<std::string> asked;
  auto ended = [&](const std::string& job) {
    asked.push_back(job);
    return absl::FailedPreconditionError("store: job \"" + job + "\" has ended");
  };
  Status s = AuthorizeStoreCall(roles_, key, worker, true, "job-1/3", ended);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("job-1"), absl::string_view::npos) << s;
  EXPECT_EQ(asked, std::vector<std::string>{"job-1"});
  EXPECT_TRUE(AuthorizeStoreCall(roles_, key, "Bearer admin-secret", true, "job-1/3", ended).ok());
  // A bad token is refused as before, before the job is looked up.
  EXPECT_EQ(AuthorizeStoreCall(roles_, key, worker, true, "job-2/0", ended).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(asked.size(), 1u);
  EXPECT_TRUE(AuthorizeStoreCall(roles_, key, worker, true, "job-1/3",
                                 [](const std::string&) { return absl::OkStatus(); })
                  .ok());
}

// During a rotation a role admits its current token and those listed after
// it, and not the old one once it is dropped.
TEST_F(RolesTest, ARoleAdmitsEveryListedToken) {
  roles_.SetTokens(Role::kViewer, {"viewer-2", "viewer-secret"});
  EXPECT_EQ(roles_.RoleOf("viewer-2"), Role::kViewer);
  EXPECT_EQ(roles_.RoleOf("viewer-secret"), Role::kViewer);
  EXPECT_EQ(roles_.Digest(Role::kViewer), TokenSha256("viewer-2"));
  roles_.SetTokens(Role::kViewer, {"viewer-2"});
  EXPECT_FALSE(roles_.RoleOf("viewer-secret").has_value());
  EXPECT_EQ(roles_.RoleOf("viewer-2"), Role::kViewer);
}

TEST_F(RolesTest, UnsetDigestsAdmitNobody) {
  RoleTokens empty;
  EXPECT_FALSE(empty.RoleOf("").has_value());
  EXPECT_FALSE(empty.RoleOf("anything").has_value());
  EXPECT_EQ(AuthorizeRpc(empty, "AgentService/ReadLogs", "Bearer ", true).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(roles_.RoleOf("").has_value());
  EXPECT_EQ(roles_.RoleOf(kViewer), Role::kViewer);
  EXPECT_EQ(roles_.RoleOf(kAgent), Role::kAgent);
  EXPECT_EQ(roles_.RoleOf(kAdmin), Role::kAdmin);
}

TEST_F(RolesTest, DigestIsSha256Hex) {
  EXPECT_EQ(TokenSha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  RoleTokens digests;
  digests.SetDigest(Role::kViewer, TokenSha256("v"));
  EXPECT_EQ(digests.Digest(Role::kViewer), TokenSha256("v"));
  EXPECT_EQ(digests.RoleOf("v"), Role::kViewer);
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
