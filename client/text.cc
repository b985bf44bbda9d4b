#include "client/text.h"

#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lockstep {
namespace client {

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string StateName(v1::JobState s) {
  constexpr absl::string_view kPrefix = "JOB_STATE_";
  return v1::JobState_Name(s).substr(kPrefix.size());
}

std::string WorkerStateName(v1::WorkerState s) {
  constexpr absl::string_view kPrefix = "WORKER_STATE_";
  return v1::WorkerState_Name(s).substr(kPrefix.size());
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

std::string TimeOf(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  time_t t = unix_ms / 1000;
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return absl::StrFormat("%s.%03dZ", buf, static_cast<int>(unix_ms % 1000));
}

}  // namespace client
}  // namespace lockstep
