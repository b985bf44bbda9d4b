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

namespace {

// The code point starting at text[*i], advancing *i past it; -1 (and one
// byte) for a byte that does not start a valid UTF-8 sequence.
int32_t NextCodePoint(absl::string_view text, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(*i);
  int len = 0;
  int32_t cp = 0;
  if (lead < 0x80) {
    len = 1;
    cp = lead;
  } else if ((lead & 0xe0) == 0xc0) {
    len = 2;
    cp = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    len = 3;
    cp = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    len = 4;
    cp = lead & 0x07;
  }
  if (len == 0 || *i + len > text.size()) {
    ++*i;
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if ((byte(*i + k) & 0xc0) != 0x80) {
      ++*i;
      return -1;
    }
    cp = (cp << 6) | (byte(*i + k) & 0x3f);
  }
  *i += len;
  return cp;
}

// Columns of one code point: the common cases of Unicode's East Asian
// Width (W and F) and of its combining marks, not the full tables.
int CodePointWidth(int32_t cp) {
  if (cp < 0) return 1;
  if ((cp >= 0x0300 && cp <= 0x036f) || (cp >= 0x200b && cp <= 0x200f) ||
      (cp >= 0xfe00 && cp <= 0xfe0f)) {
    return 0;  // combining diacritics, zero-width spaces and joiners, variation selectors
  }
  const bool wide = (cp >= 0x1100 && cp <= 0x115f) ||   // Hangul Jamo
                    (cp >= 0x2e80 && cp <= 0x303e) ||   // CJK radicals, punctuation
                    (cp >= 0x3041 && cp <= 0x33ff) ||   // kana, CJK symbols
                    (cp >= 0x3400 && cp <= 0x4dbf) ||   // CJK extension A
                    (cp >= 0x4e00 && cp <= 0x9fff) ||   // CJK unified ideographs
                    (cp >= 0xa000 && cp <= 0xa4cf) ||   // Yi
                    (cp >= 0xac00 && cp <= 0xd7a3) ||   // Hangul syllables
                    (cp >= 0xf900 && cp <= 0xfaff) ||   // CJK compatibility ideographs
                    (cp >= 0xfe30 && cp <= 0xfe4f) ||   // CJK compatibility forms
                    (cp >= 0xff00 && cp <= 0xff60) ||   // fullwidth forms
                    (cp >= 0xffe0 && cp <= 0xffe6) ||   // fullwidth signs
                    (cp >= 0x1f300 && cp <= 0x1f64f) ||  // pictographs, emoticons
                    (cp >= 0x1f680 && cp <= 0x1f6ff) ||  // transport and map symbols
                    (cp >= 0x1f900 && cp <= 0x1f9ff) ||  // supplemental pictographs
                    (cp >= 0x20000 && cp <= 0x3fffd);    // CJK extensions B and on
  return wide ? 2 : 1;
}

}  // namespace

int DisplayWidth(absl::string_view text) {
  int width = 0;
  for (size_t i = 0; i < text.size();) width += CodePointWidth(NextCodePoint(text, &i));
  return width;
}

std::string PadRight(absl::string_view text, int width) {
  std::string out(text);
  const int have = DisplayWidth(text);
  if (have < width) out.append(width - have, ' ');
  return out;
}

std::string JobListTable(const std::vector<v1::Job>& jobs) {
  constexpr int kNameWidth = 14;
  std::string out = absl::StrFormat("%-20s %s %-11s %-6s %-9s %-6s %s\n", "JOB",
                                    PadRight("NAME", kNameWidth), "STATE", "ROUND", "RESTARTS",
                                    "WORLD", "SUBMITTED");
  for (const auto& j : jobs) {
    absl::StrAppendFormat(
        &out, "%-20s %s %-11s %-6d %-9s %-6d %s\n", j.job_id(),
        PadRight(j.spec().name().empty() ? "-" : Printable(j.spec().name()), kNameWidth),
        StateName(j.state()), j.round(), absl::StrCat(j.restart_count(), "/", j.spec().max_restarts()),
        j.world_size(), TimeOf(j.submitted_unix_ms()));
  }
  return out;
}

}  // namespace client
}  // namespace lockstep
