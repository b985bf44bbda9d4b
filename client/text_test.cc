#include "client/text.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_split.h"

namespace lockstep {
namespace client {
namespace {

TEST(TextTest, DisplayWidthCountsColumnsNotBytes) {
  EXPECT_EQ(DisplayWidth("train"), 5);
  EXPECT_EQ(DisplayWidth("h\xc3\xa9llo"), 5);             // é: 2 bytes, 1 column
  EXPECT_EQ(DisplayWidth("e\xcc\x81"), 1);                // e + combining acute
  EXPECT_EQ(DisplayWidth("\xe8\xae\xad\xe7\xbb\x83"), 4);  // 训练: 2 wide characters
  EXPECT_EQ(DisplayWidth("\xf0\x9f\x9a\x80"), 2);          // 🚀
  EXPECT_EQ(DisplayWidth("\xff\xc3"), 2);                  // not UTF-8: a column per byte
}

TEST(TextTest, PadRightPadsToDisplayColumns) {
  EXPECT_EQ(PadRight("ab", 4), "ab  ");
  EXPECT_EQ(PadRight("\xe8\xae\xad\xe7\xbb\x83", 6), "\xe8\xae\xad\xe7\xbb\x83  ");
  EXPECT_EQ(PadRight("too long", 3), "too long");
}

// The STATE column starts in the same terminal column on every line,
// whatever script the job names are written in.
TEST(TextTest, JobListColumnsAlignWithNonAsciiNames) {
  std::vector<v1::Job> jobs(4);
  const char* names[] = {"ascii", "r\xc3\xa9sum\xc3\xa9", "\xe8\xae\xad\xe7\xbb\x83", ""};
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].set_job_id("j-000000000000000" + std::to_string(i));
    jobs[i].mutable_spec()->set_name(names[i]);
    jobs[i].set_state(v1::JOB_STATE_RUNNING);
  }
  const std::string table = JobListTable(jobs);
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << table;
  for (const std::string& line : lines) {
    const std::string word = &line == &lines[0] ? "STATE" : "RUNNING";
    const size_t at = line.find(word);
    ASSERT_NE(at, std::string::npos) << line;
    EXPECT_EQ(DisplayWidth(line.substr(0, at)), 36) << table;
  }
  EXPECT_NE(lines[4].find(" -  "), std::string::npos) << "an unnamed job shows -: " << lines[4];
}

}  // namespace
}  // namespace client
}  // namespace lockstep
