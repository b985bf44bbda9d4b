#include "client/json.h"

#include <cmath>

#include <gtest/gtest.h>

#include "lockstep/v1/agent.pb.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace client {
namespace {

TEST(JsonTest, EveryFieldPresentNumbersAsNumbersEnumsWithoutPrefix) {
  v1::Job job;
  job.set_job_id("j-1");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  v1::WorkerStatus* w = job.add_workers();  // rank 0, exit code 0: zero values
  w->set_pid(4242);
  w->set_state(v1::WORKER_STATE_EXITED);
  w->mutable_exit();
  (*job.mutable_spec()->mutable_env())["A"] = "x\"y";
  const std::string json = ToJson(job);
  EXPECT_NE(json.find("\"job_id\":\"j-1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\":\"SUCCEEDED\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"restart_count\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rank\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"pid\":4242"), std::string::npos) << json;  // a number, not "4242"
  EXPECT_NE(json.find("\"state\":\"EXITED\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"exit_code\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"first_failure\":null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"consequences\":[]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"env\":{\"A\":\"x\\\"y\"}"), std::string::npos) << json;
  EXPECT_EQ(json.find("JOB_STATE_"), std::string::npos) << json;
}

TEST(JsonTest, LogBytesAreTextAndOddValuesStayValidJson) {
  v1::ReadLogsResponse logs;
  logs.set_data("step 1\n\x1b[31mred\xff\tok \xc3\xa9");
  logs.set_next_offset(int64_t{1} << 40);
  std::string json = ToJson(logs);
  EXPECT_EQ(json,
            "{\"data\":\"step 1\\n\\u001b[31mred\\ufffd\\tok \xc3\xa9\",\"next_offset\":1099511627776,"
            "\"worker_done\":false,\"path\":\"\",\"generation\":\"\",\"rotated_past\":false}");
  v1::RankProgress p;
  p.set_loss(std::nan(""));
  json = ToJson(p);
  EXPECT_NE(json.find("\"loss\":null"), std::string::npos) << json;
  EXPECT_EQ(EnumName(*v1::ReadLogsRequest::Stream_descriptor()->FindValueByName("STREAM_STDERR")),
            "STDERR");
}

}  // namespace
}  // namespace client
}  // namespace lockstep
