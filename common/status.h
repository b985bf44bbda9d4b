// Status helpers used at every module boundary.
//
// Lockstep uses absl::Status / absl::StatusOr<T> with canonical codes only
// (see STYLE.md "Errors"). These macros propagate them without noise.
#ifndef LOCKSTEP_COMMON_STATUS_H_
#define LOCKSTEP_COMMON_STATUS_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

using absl::Status;
using absl::StatusOr;

// Returns `status` with `context` prepended to its message ("context: msg"),
// keeping the code and the payloads. OK passes through unchanged.
Status Annotate(const Status& status, absl::string_view context);

// Default: how many bytes of untrusted input an error message quotes.
inline constexpr size_t kMaxQuotedBytes = 64;

// `value` in double quotes for an error message, safe to print and short:
// at most `max_bytes` bytes of it, then "...(N bytes)" naming the full
// size; backslash, '"', control characters (NUL, newline, ESC, ...) and
// bytes >= 0x7f are escaped (\n, \t, \xNN). Every error that echoes a
// request field goes through this, so a megabyte of input never comes back.
std::string QuoteForError(absl::string_view value, size_t max_bytes = kMaxQuotedBytes);

}  // namespace lockstep

#define LOCKSTEP_STATUS_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_STATUS_CONCAT_(a, b) LOCKSTEP_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// if it is not OK.
#define RETURN_IF_ERROR(expr)                                         \
  do {                                                                \
    ::absl::Status lockstep_status_ = (expr);                         \
    if (!lockstep_status_.ok()) return lockstep_status_;              \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>);
// returns its status if not OK, else moves the value into `lhs`, which may
// be a declaration ("auto x").
#define ASSIGN_OR_RETURN(lhs, expr)                                          \
  ASSIGN_OR_RETURN_IMPL_(LOCKSTEP_STATUS_CONCAT_(lockstep_statusor_, __LINE__), \
                         lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#endif  // LOCKSTEP_COMMON_STATUS_H_
