#include "client/watch.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace lockstep {
namespace client {
namespace {

constexpr int64_t kNow = 1795000000000;  // 2026-11-18

v1::Job RunningJob(int ranks) {
  v1::Job job;
  job.set_job_id("job-0123456789abcdef");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_round(2);
  job.set_restart_count(1);
  job.mutable_spec()->set_max_restarts(3);
  job.mutable_spec()->set_name("a-rather-long-name-that-goes-on-and-on-past-the-edge-of-the-screen");
  job.set_world_size(ranks);
  job.add_node_ids("node-a");
  for (int r = 0; r < ranks; ++r) {
    auto* w = job.add_workers();
    w->set_rank(r);
    w->set_node_id("a-node-with-a-long-hostname");
    w->set_state(v1::WORKER_STATE_RUNNING);
    w->mutable_progress()->set_step(123456);
    w->mutable_progress()->set_loss(0.123456);
    w->mutable_progress()->set_samples_per_s(125.5);
    w->mutable_progress()->set_forward_ms(100);
    w->mutable_progress()->set_backward_ms(150.25);
    w->mutable_progress()->set_exposed_comm_ms(12.5);
    w->mutable_progress()->set_reported_unix_ms(kNow - 3000);
  }
  return job;
}

WatchContext Fresh(int width = 80, int rows = 24) {
  WatchContext ctx;
  ctx.now_unix_ms = kNow;
  ctx.fetched_unix_ms = kNow;
  ctx.coordinator = "127.0.0.1:7070";
  ctx.width = width;
  ctx.max_lines = rows;
  return ctx;
}

TEST(RenderWatchTest, EveryLineFitsTheWidth) {
  for (int width : {40, 80, 120}) {
    for (const auto& line : RenderWatch(RunningJob(4), Fresh(width))) {
      EXPECT_LE(static_cast<int>(line.size()), width) << line;
    }
  }
}

// Width 0 (what `watch` uses when piped): nothing is cut, so a long
// failure message or stale line reaches a log whole.
TEST(RenderWatchTest, WidthZeroCutsNothing) {
  v1::Job job = RunningJob(2);
  const std::string message(300, 'm');
  job.set_message(message);
  bool whole = false;
  for (const auto& line : RenderWatch(job, Fresh(0))) {
    // (A long node name is cut inside its column, '~' mid-line: the table's own.)
    EXPECT_NE(line.back(), '~') << line;
    if (line.find(message) != std::string::npos) whole = true;
  }
  EXPECT_TRUE(whole) << "the 300-character message was cut";
}

TEST(RenderWatchTest, ShowsStateAndEveryRanksProgress) {
  auto lines = RenderWatch(RunningJob(2), Fresh(120));
  const std::string all = absl::StrJoin(lines, "\n");
  EXPECT_TRUE(absl::StrContains(all, "RUNNING  round 2  restarts 1/3  world 2")) << all;
  EXPECT_FALSE(absl::StrContains(all, "STALE")) << all;
  int rank_rows = 0;
  for (const auto& l : lines) {
    if (absl::StartsWith(l, "0 ") || absl::StartsWith(l, "1 ")) {
      ++rank_rows;
      EXPECT_TRUE(absl::StrContains(l, "123456")) << l;    // step
      EXPECT_TRUE(absl::StrContains(l, "125.5")) << l;     // samples/s
      EXPECT_TRUE(absl::StrContains(l, "250.2")) << l;     // step ms: fwd + bwd
      EXPECT_TRUE(absl::StrContains(l, " 3s")) << l;       // progress age
    }
  }
  EXPECT_EQ(rank_rows, 2) << all;
}

TEST(RenderWatchTest, MarksStaleDataWithItsAge) {
  WatchContext ctx = Fresh();
  ctx.fetched_unix_ms = kNow - 20000;
  ctx.unreachable_since_unix_ms = kNow - 19000;
  ctx.last_error = "UNAVAILABLE";
  auto lines = RenderWatch(RunningJob(2), ctx);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_TRUE(absl::StartsWith(lines[1], "STALE: coordinator 127.0.0.1:7070 unreachable for 19s"))
      << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "RUNNING (stale)")) << lines[2];
}

TEST(RenderWatchTest, FitsOneScreenSummarisingTheRanksThatDoNotFit) {
  auto lines = RenderWatch(RunningJob(100), Fresh(80, 24));
  EXPECT_EQ(lines.size(), 24u);
  EXPECT_TRUE(absl::StartsWith(lines.back(), "... ")) << lines.back();
}

// Fewer rows than the lines above the ranks (header, state, a message, a
// hang): still no more lines than rows, the last one saying so.
TEST(RenderWatchTest, ATerminalShorterThanTheHeaderStillDoesNotScroll) {
  v1::Job job = RunningJob(4);
  job.set_message("a message line");
  v1::Hang* h = job.mutable_health()->mutable_hang();
  h->add_waiting_ranks(0);
  h->set_wait_s(9);
  for (int rows : {1, 2, 3, 4}) {
    auto lines = RenderWatch(job, Fresh(80, rows));
    EXPECT_EQ(lines.size(), static_cast<size_t>(rows)) << rows;
    EXPECT_TRUE(absl::StartsWith(lines.back(), "... ")) << rows << ": " << lines.back();
  }
}

TEST(RenderWatchTest, WorkerTextIsEscaped) {
  v1::Job job = RunningJob(1);
  job.set_message("bad\x1b[2Jthing");
  const std::string all = absl::StrJoin(RenderWatch(job, Fresh(200)), "\n");
  EXPECT_FALSE(absl::StrContains(all, "\x1b")) << all;
  EXPECT_TRUE(absl::StrContains(all, "bad\\x1b[2Jthing")) << all;
}

TEST(RenderWatchTest, NamesTheStragglerAboveTheRanksAndPrefersTheWallClockStep) {
  v1::Job job = RunningJob(2);
  job.mutable_workers(1)->mutable_progress()->set_step_ms(400.5);
  v1::Straggler* s = job.mutable_health()->mutable_straggler();
  s->set_rank(1);
  s->set_lag_ms(180);
  s->set_bucket(0);
  s->set_steps(8);
  auto lines = RenderWatch(job, Fresh());
  int straggler = -1, header = -1;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StartsWith(lines[i], "straggler: rank 1")) straggler = static_cast<int>(i);
    if (absl::StartsWith(lines[i], "RANK ")) header = static_cast<int>(i);
    if (absl::StartsWith(lines[i], "1 ")) {
      EXPECT_TRUE(absl::StrContains(lines[i], "400.5")) << lines[i];
    }
  }
  EXPECT_GE(straggler, 0) << absl::StrJoin(lines, "\n");
  EXPECT_LT(straggler, header) << absl::StrJoin(lines, "\n");
}

TEST(RedrawInPlaceTest, HomesClearsEachLineAndNeverEndsWithANewline) {
  EXPECT_EQ(RedrawInPlace({"a", "b"}), "\x1b[Ha\x1b[K\nb\x1b[K\x1b[J");
}

}  // namespace
}  // namespace client
}  // namespace lockstep
