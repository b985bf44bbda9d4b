// `lockstep watch`: one screen that shows a job's state, its health
// (stragglers, hangs: client/health_format.h) and every rank's progress, redrawn in place on a terminal (cursor home, each line cleared
// to its end, the rest of the screen cleared: nothing scrolls, nothing
// wraps), plain text blocks when piped, and marked STALE while the
// coordinator cannot be reached.
//
// The frame is computed by RenderWatch, a pure function (watch_test.cc);
// the loop that fetches the job and draws it is in lockstep_main.cc.
#ifndef LOCKSTEP_CLIENT_WATCH_H_
#define LOCKSTEP_CLIENT_WATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace client {

struct WatchContext {
  int64_t now_unix_ms = 0;
  // > 0: the coordinator has not answered since this time; the job shown
  // is what it said at `fetched_unix_ms`.
  int64_t unreachable_since_unix_ms = 0;
  int64_t fetched_unix_ms = 0;
  std::string coordinator;   // host:port, named in the stale line
  std::string last_error;    // why the last fetch failed (short)
  int width = 80;            // columns; every line is cut to fit (0: none is)
  int max_lines = 24;        // rows; ranks past this are summarised
};

// The lines of one frame, none longer than ctx.width.
std::vector<std::string> RenderWatch(const v1::Job& job, const WatchContext& ctx);

// What a terminal needs to show `lines` in place of the previous frame:
// home, each line followed by clear-to-end-of-line, then clear to the end
// of the screen. The last line has no newline, so a full screen never
// scrolls.
std::string RedrawInPlace(const std::vector<std::string>& lines);

// Columns and rows of the terminal on `fd`; {80, 24} when it is not one.
std::pair<int, int> TerminalSize(int fd);

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_WATCH_H_
