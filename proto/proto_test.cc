// The generated API compiles, links and round-trips through the wire format.
#include <gtest/gtest.h>

#include "lockstep/v1/agent.grpc.pb.h"
#include "lockstep/v1/coordinator.grpc.pb.h"
#include "lockstep/v1/store.grpc.pb.h"

namespace lockstep {
namespace {

TEST(ProtoTest, JobSpecRoundTripsThroughWireFormat) {
  v1::SubmitJobRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  spec->add_command("./train");
  spec->add_command("--lr=0.1");
  spec->set_min_nodes(1);
  spec->set_max_nodes(4);
  spec->set_nproc_per_node(2);
  (*spec->mutable_env())["OMP_NUM_THREADS"] = "1";
  std::string wire = req.SerializeAsString();
  v1::SubmitJobRequest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.spec().command_size(), 2);
  EXPECT_EQ(back.spec().max_nodes(), 4);
  EXPECT_EQ(back.spec().env().at("OMP_NUM_THREADS"), "1");
}

TEST(ProtoTest, ServicesHaveVersionedFullNames) {
  EXPECT_STREQ(v1::CoordinatorService::service_full_name(), "lockstep.v1.CoordinatorService");
  EXPECT_STREQ(v1::StoreService::service_full_name(), "lockstep.v1.StoreService");
  EXPECT_STREQ(v1::AgentService::service_full_name(), "lockstep.v1.AgentService");
  EXPECT_EQ(v1::JobState_Name(v1::JOB_STATE_RUNNING), "JOB_STATE_RUNNING");
}

}  // namespace
}  // namespace lockstep
