#include "client/state_lines.h"

#include "absl/strings/str_cat.h"
#include "client/text.h"

namespace lockstep {
namespace client {
namespace {

bool SameEvent(const v1::JobEvent& a, const v1::JobEvent& b) {
  return a.unix_ms() == b.unix_ms() && a.state() == b.state() && a.round() == b.round() &&
         a.detail() == b.detail();
}

}  // namespace

std::string StateLines::Line(v1::JobState state, int round, int restarts, int max_restarts,
                             const std::string& message) {
  return absl::StrCat(StateName(state), "  round ", round, "  restarts ", restarts, "/",
                      max_restarts, "  ", Printable(message));
}

void StateLines::Print(const v1::Job& job, std::ostream& os) {
  const auto& history = job.history();
  // The events after the newest one seen before. History drops its oldest
  // events but the first past 200, so look for it from the end; if it is
  // gone, every event is older than the snapshot.
  int next = 0;
  if (seen_any_) {
    next = history.size();
    for (int i = history.size() - 1; i >= 0; --i) {
      if (SameEvent(history[i], last_seen_)) {
        next = i + 1;
        break;
      }
    }
  }
  for (int i = next; i < history.size(); ++i) {
    const v1::JobEvent& e = history[i];
    const bool current = e.state() == job.state() && e.round() == job.round();
    if (!current && (e.state() != state_ || e.round() != round_)) {
      os << "lockstep: "
         << Line(e.state(), e.round(), e.restart_count(), job.spec().max_restarts(), e.detail())
         << std::endl;
      state_ = e.state();
      round_ = e.round();
    }
  }
  if (!history.empty()) {
    last_seen_ = history[history.size() - 1];
    seen_any_ = true;
  }
  const std::string line = Line(job.state(), job.round(), job.restart_count(),
                                job.spec().max_restarts(), job.message());
  if (line != last_line_) os << "lockstep: " << line << std::endl;
  last_line_ = line;
  state_ = job.state();
  round_ = job.round();
}

}  // namespace client
}  // namespace lockstep
