#include "client/watch.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/health_format.h"
#include "client/text.h"

namespace lockstep {
namespace client {
namespace {

// Cuts `line` to `width` columns (one byte is one column: everything here
// is ASCII, and Printable escapes control characters).
std::string Fit(std::string line, int width) {
  if (width > 0 && static_cast<int>(line.size()) > width) {
    line.resize(width > 1 ? width - 1 : width);
    if (width > 1) line += "~";
  }
  return line;
}

std::string Seconds(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 100 * 1000) return absl::StrFormat("%.0fs", ms / 1000.0);
  if (ms < 100 * 60 * 1000) return absl::StrFormat("%.0fm", ms / 60000.0);
  return absl::StrFormat("%.0fh", ms / 3600000.0);
}

// Seconds from `then` to `now` (ms since the epoch); "-" where they are too
// far apart to subtract (a report's time is the agent's, not checked).
std::string Age(int64_t now, int64_t then) {
  int64_t ms = 0;
  return __builtin_sub_overflow(now, then, &ms) ? "-" : Seconds(ms);
}

// "-" for NaN (no loss reported); else one decimal, or 4 significant digits.
std::string Fixed1(double v) { return std::isnan(v) ? "-" : absl::StrFormat("%.1f", v); }
std::string Short(double v) { return std::isnan(v) ? "-" : absl::StrFormat("%.4g", v); }

}  // namespace

std::vector<std::string> RenderWatch(const v1::Job& job, const WatchContext& ctx) {
  std::vector<std::string> lines;
  const auto& spec = job.spec();
  lines.push_back(absl::StrCat("job ", job.job_id(),
                               spec.name().empty() ? "" : "  (" + Printable(spec.name()) + ")",
                               "  at ", TimeOf(ctx.now_unix_ms)));
  if (ctx.unreachable_since_unix_ms > 0) {
    lines.push_back(absl::StrCat("STALE: coordinator ", ctx.coordinator, " unreachable for ",
                                 Seconds(ctx.now_unix_ms - ctx.unreachable_since_unix_ms),
                                 "; shown as of ", TimeOf(ctx.fetched_unix_ms),
                                 ctx.last_error.empty() ? "" : " (" + Printable(ctx.last_error) + ")"));
  }
  lines.push_back(absl::StrCat(StateName(job.state()),
                               ctx.unreachable_since_unix_ms > 0 ? " (stale)" : "", "  round ",
                               job.round(), "  restarts ", job.restart_count(), "/",
                               spec.max_restarts(), "  world ", job.world_size(), "  nodes ",
                               absl::StrJoin(job.node_ids(), ",")));
  if (!job.message().empty()) lines.push_back(absl::StrCat("  ", Printable(job.message())));
  // Stragglers and hangs (client/health_format.h), before the ranks.
  for (auto& line : HealthLines(job)) lines.push_back(std::move(line));
  if (job.workers_size() > 0) {
    lines.push_back(absl::StrFormat("%-4s %-12s %-8s %8s %9s %9s %8s %8s %5s", "RANK", "NODE",
                                    "STATE", "STEP", "LOSS", "SAMPLES/S", "STEP_MS", "COMM_MS",
                                    "AGE"));
  }
  const int room = std::max(1, ctx.max_lines - static_cast<int>(lines.size()));
  const int shown = job.workers_size() <= room ? job.workers_size() : room - 1;
  for (int i = 0; i < shown; ++i) {
    const v1::WorkerStatus& w = job.workers(i);
    const v1::RankProgress& p = w.progress();
    const bool reported = p.reported_unix_ms() > 0;
    // Wall clock, step end to step end (an older engine: forward + backward).
    const double step_ms = p.step_ms() > 0 ? p.step_ms() : p.forward_ms() + p.backward_ms();
    lines.push_back(absl::StrFormat(
        "%-4d %-12s %-8s %8s %9s %9s %8s %8s %5s", w.rank(), Fit(w.node_id(), 12),
        Fit(WorkerStateName(w.state()), 8), reported ? absl::StrCat(p.step()) : "-",
        reported ? Short(p.loss()) : "-", reported ? Fixed1(p.samples_per_s()) : "-",
        reported ? Fixed1(step_ms) : "-", reported ? Fixed1(p.exposed_comm_ms()) : "-",
        reported ? Age(ctx.fetched_unix_ms, p.reported_unix_ms()) : "-"));
  }
  if (shown < job.workers_size()) {
    lines.push_back(absl::StrCat("... ", job.workers_size() - shown,
                                 " more ranks (lockstep status ", job.job_id(), ")"));
  }
  // A screen too short even for the lines above the ranks: cut to it, so
  // the frame never scrolls.
  if (ctx.max_lines > 0 && static_cast<int>(lines.size()) > ctx.max_lines) {
    lines.resize(ctx.max_lines);
    lines.back() = absl::StrCat("... (", ctx.max_lines,
                                " rows are too few: lockstep status ", job.job_id(), ")");
  }
  for (auto& l : lines) l = Fit(std::move(l), ctx.width);
  return lines;
}

std::string RedrawInPlace(const std::vector<std::string>& lines) {
  std::string out = "\x1b[H";
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StrAppend(&out, lines[i], "\x1b[K", i + 1 < lines.size() ? "\n" : "");
  }
  absl::StrAppend(&out, "\x1b[J");
  return out;
}

std::pair<int, int> TerminalSize(int fd) {
  struct winsize ws {};
  if (::isatty(fd) && ::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    return {ws.ws_col, ws.ws_row};
  }
  return {80, 24};
}

}  // namespace client
}  // namespace lockstep
