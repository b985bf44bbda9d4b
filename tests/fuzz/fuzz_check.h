// Checks for the fuzz targets in this directory (tests/fuzz/README.md).
//
// FUZZ_CHECK(cond, detail) is never compiled out: a failed invariant prints
// the condition, where it is and `detail`, then aborts, which libFuzzer
// reports as a crash and saves the input that caused it. The targets assert
// what the code under test promises in its header, not what it happens to do.
#ifndef LOCKSTEP_TESTS_FUZZ_FUZZ_CHECK_H_
#define LOCKSTEP_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/stubs/logging.h"

namespace lockstep {
namespace fuzz {

[[noreturn]] inline void Fail(const char* cond, const char* file, int line,
                              const std::string& detail) {
  std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n  %s\n", file, line, cond,
               detail.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(cond, detail)                                        \
  do {                                                                  \
    if (!(cond)) ::lockstep::fuzz::Fail(#cond, __FILE__, __LINE__, (detail)); \
  } while (0)

// Silences protobuf's log, which reports every string field it refuses to
// parse as invalid UTF-8: noise at thousands of inputs a second. For
// LLVMFuzzerInitialize.
inline void QuietProtobufLog() { google::protobuf::SetLogHandler(nullptr); }

// An error message as the callers promise it: at most `max_bytes` long, and
// safe to print (printable ASCII only: QuoteForError escapes the rest).
// `what` names the call for the report.
inline void CheckErrorMessage(const absl::Status& status, size_t max_bytes, absl::string_view what) {
  if (status.ok()) return;
  const absl::string_view message = status.message();
  FUZZ_CHECK(!message.empty(), std::string(what) + ": an error without a message");
  FUZZ_CHECK(message.size() <= max_bytes,
             std::string(what) + ": " + std::to_string(message.size()) +
                 "-byte error message (the bound is " + std::to_string(max_bytes) +
                 "): " + QuoteForError(message, 200));
  for (unsigned char c : message) {
    FUZZ_CHECK(c >= 0x20 && c < 0x7f, std::string(what) +
                                          ": unescaped byte in error message: " +
                                          QuoteForError(message, 200));
  }
}

// The session inputs of store_fuzzer and coordinator_fuzzer are protobuf
// wire format: `repeated Step step = 1`, each Step one field of a oneof
// (tests/fuzz/seeds/fuzz_input.proto writes them down for protoc). One
// field of a Step: its number and, for a length-delimited field, its bytes
// (a request message, parsed by the caller with ParseFromString), else its
// varint.
struct Field {
  int number = 0;
  bool is_bytes = false;
  std::string bytes;
  uint64_t varint = 0;
};

// Reads the next field from `in`. False at the end, on malformed wire data
// or a wire type other than varint and length-delimited (the input ends
// there).
inline bool NextField(google::protobuf::io::CodedInputStream* in, Field* field) {
  const uint32_t tag = in->ReadTag();
  if (tag == 0) return false;
  field->number = static_cast<int>(tag >> 3);
  switch (tag & 7) {
    case 0:
      field->is_bytes = false;
      return in->ReadVarint64(&field->varint);
    case 2: {
      uint32_t size = 0;
      field->is_bytes = true;
      return in->ReadVarint32(&size) && in->ReadString(&field->bytes, static_cast<int>(size));
    }
    default:
      return false;
  }
}

// Calls `step(field)` with the one field of each `step = 1` record of
// `data`, in order, until the input or the wire data ends.
template <typename F>
void ForEachStep(const uint8_t* data, size_t size, F step) {
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  Field outer;
  while (NextField(&in, &outer)) {
    if (outer.number != 1 || !outer.is_bytes) continue;
    google::protobuf::io::CodedInputStream inner(
        reinterpret_cast<const uint8_t*>(outer.bytes.data()), static_cast<int>(outer.bytes.size()));
    Field field;
    if (NextField(&inner, &field)) step(field);
  }
}

}  // namespace fuzz
}  // namespace lockstep

#endif  // LOCKSTEP_TESTS_FUZZ_FUZZ_CHECK_H_
