#include "common/status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace lockstep {

Status Annotate(const Status& status, absl::string_view context) {
  if (status.ok()) return status;
  Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

std::string QuoteForError(absl::string_view value, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  const absl::string_view shown = value.substr(0, max_bytes);
  for (unsigned char c : shown) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  if (shown.size() < value.size()) absl::StrAppend(&out, "...(", value.size(), " bytes)");
  return out;
}

}  // namespace lockstep
