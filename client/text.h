// Text the CLI prints: escaping of what comes from jobs and daemons, the
// names of states without their enum prefixes, UTC times.
#ifndef LOCKSTEP_CLIENT_TEXT_H_
#define LOCKSTEP_CLIENT_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "lockstep/v1/common.pb.h"

namespace lockstep {
namespace client {

// `text` safe to print on a terminal: control characters (ESC sequences
// from a worker's stderr, NUL, CR...) and DEL become \xNN; newline and tab
// stay, and so does UTF-8. Everything the CLI prints from a job or a
// daemon goes through it.
std::string Printable(absl::string_view text);

// "RUNNING", "SUCCEEDED": the enum name without JOB_STATE_ / WORKER_STATE_.
std::string StateName(v1::JobState s);
std::string WorkerStateName(v1::WorkerState s);
bool IsTerminal(v1::JobState s);

// "2026-11-24 10:00:01.250Z"; "-" for 0.
std::string TimeOf(int64_t unix_ms);

// Terminal columns `text` takes: a column per UTF-8 code point, two for
// East Asian wide and fullwidth ones (CJK, Hangul, fullwidth forms, most
// emoji), none for combining marks; a byte that is not UTF-8 takes one.
int DisplayWidth(absl::string_view text);

// `text` followed by spaces up to `width` display columns (DisplayWidth);
// unchanged when it is as wide or wider. What "%-Ns" does for ASCII.
std::string PadRight(absl::string_view text, int width);

// `lockstep list`'s table: a header line, then a line per job (JOB NAME
// STATE ROUND RESTARTS WORLD SUBMITTED), columns aligned on a terminal
// whatever script the names are in.
std::string JobListTable(const std::vector<v1::Job>& jobs);

}  // namespace client
}  // namespace lockstep

#endif  // LOCKSTEP_CLIENT_TEXT_H_
