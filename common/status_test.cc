#include "common/status.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status CheckQuarter(int x) {
  RETURN_IF_ERROR(Quarter(x).status());
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnPropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(3).status().message(), "odd");
}

TEST(StatusTest, ReturnIfErrorStopsOnError) {
  EXPECT_TRUE(CheckQuarter(4).ok());
  EXPECT_FALSE(CheckQuarter(2).ok());
}

TEST(StatusTest, AnnotateKeepsCodeAndPrependsContext) {
  Status s = Annotate(absl::NotFoundError("key 'a'"), "store get");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "store get: key 'a'");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
  Status with = absl::UnavailableError("gone");
  with.SetPayload("lockstep.test/payload", absl::Cord("7"));
  EXPECT_EQ(Annotate(with, "outer").GetPayload("lockstep.test/payload"), absl::Cord("7"));
}

TEST(StatusTest, QuoteForErrorEscapesAndTruncates) {
  EXPECT_EQ(QuoteForError("abc"), "\"abc\"");
  EXPECT_EQ(QuoteForError(std::string("a\0b\n\x1b[31m\"\\", 11)), "\"a\\x00b\\n\\x1b[31m\\\"\\\\\"");
  const std::string big(1 << 20, 'x');
  const std::string quoted = QuoteForError(big);
  EXPECT_LT(quoted.size(), 100u);
  EXPECT_EQ(quoted, "\"" + std::string(kMaxQuotedBytes, 'x') + "\"...(1048576 bytes)");
  EXPECT_EQ(QuoteForError("abcdef", 3), "\"abc\"...(6 bytes)");
  EXPECT_EQ(QuoteForError(""), "\"\"");
}

}  // namespace
}  // namespace lockstep
