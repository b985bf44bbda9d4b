#include "client/json.h"

#include <cctype>
#include <cmath>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lockstep {
namespace client {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Length of the valid UTF-8 sequence at s[i], or 0.
size_t Utf8Length(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  }
  return n;
}

void AppendString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8Length(s, i);
    if (n == 0) {
      absl::StrAppend(out, "\\ufffd");
      ++i;
      continue;
    }
    if (n > 1) {
      out->append(s, i, n);
    } else if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\n') {
      absl::StrAppend(out, "\\n");
    } else if (c == '\t') {
      absl::StrAppend(out, "\\t");
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(out, "\\u%04x", c);
    } else {
      out->push_back(static_cast<char>(c));
    }
    i += n;
  }
  out->push_back('"');
}

void AppendDouble(std::string* out, double d) {
  if (!std::isfinite(d)) {
    absl::StrAppend(out, "null");
  } else {
    absl::StrAppendFormat(out, "%.17g", d);
  }
}

void AppendMessage(std::string* out, const Message& m);

// One value of `field`: element `index` of a repeated field, or the
// singular value when index < 0.
void AppendValue(std::string* out, const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(out, rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(out, rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      AppendDouble(out, rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      AppendDouble(out, rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      absl::StrAppend(out, (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      AppendString(out, EnumName(rep ? *r->GetRepeatedEnum(m, f, index) : *r->GetEnum(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      AppendString(out, rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      AppendMessage(out, rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
      break;
  }
}

void AppendMessage(std::string* out, const Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  out->push_back('{');
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (i > 0) out->push_back(',');
    AppendString(out, f->name());
    out->push_back(':');
    if (f->is_map()) {
      // Entries as an object keyed by the key's text, in wire order.
      const FieldDescriptor* key = f->message_type()->map_key();
      const FieldDescriptor* value = f->message_type()->map_value();
      out->push_back('{');
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const Message& entry = r->GetRepeatedMessage(m, f, k);
        if (k > 0) out->push_back(',');
        std::string key_text;
        AppendValue(&key_text, entry, key, -1);
        if (key_text.empty() || key_text[0] != '"') key_text = absl::StrCat("\"", key_text, "\"");
        absl::StrAppend(out, key_text, ":");
        AppendValue(out, entry, value, -1);
      }
      out->push_back('}');
    } else if (f->is_repeated()) {
      out->push_back('[');
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        if (k > 0) out->push_back(',');
        AppendValue(out, m, f, k);
      }
      out->push_back(']');
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(m, f)) {
      absl::StrAppend(out, "null");
    } else {
      AppendValue(out, m, f, -1);
    }
  }
  out->push_back('}');
}

}  // namespace

std::string EnumName(const google::protobuf::EnumValueDescriptor& value) {
  // JobState -> "JOB_STATE_".
  std::string prefix;
  for (char c : value.type()->name()) {
    if (std::isupper(static_cast<unsigned char>(c)) && !prefix.empty()) prefix.push_back('_');
    prefix.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  }
  prefix.push_back('_');
  const std::string& name = value.name();
  if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) {
    return name.substr(prefix.size());
  }
  return name;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  AppendMessage(&out, message);
  return out;
}

}  // namespace client
}  // namespace lockstep
