#include "common/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lockstep {

FlagSet::FlagSet(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagSet::Add(const std::string& name, Flag flag) {
  auto [it, inserted] = flags_.emplace(name, std::move(flag));
  (void)it;
  if (!inserted) {
    std::fprintf(stderr, "FATAL: flag --%s registered twice\n", name.c_str());
    std::abort();
  }
}

void FlagSet::String(const std::string& name, std::string* target, std::string help) {
  Add(name, Flag{std::move(help), *target, false, [target](const std::string& v) {
                   *target = v;
                   return absl::OkStatus();
                 }});
}

void FlagSet::Int(const std::string& name, int64_t* target, std::string help) {
  Add(name, Flag{std::move(help), absl::StrCat(*target), false,
                 [target, name](const std::string& v) {
                   if (!absl::SimpleAtoi(v, target)) {
                     return absl::InvalidArgumentError(absl::StrCat(
                         "flag --", name, ": '", v, "' is not an integer"));
                   }
                   return absl::OkStatus();
                 }});
}

void FlagSet::Int32(const std::string& name, int32_t* target, std::string help) {
  Add(name, Flag{std::move(help), absl::StrCat(*target), false,
                 [target, name](const std::string& v) {
                   if (!absl::SimpleAtoi(v, target)) {
                     return absl::InvalidArgumentError(absl::StrCat(
                         "flag --", name, ": '", v, "' is not a 32-bit integer"));
                   }
                   return absl::OkStatus();
                 }});
}

void FlagSet::Double(const std::string& name, double* target, std::string help) {
  Add(name, Flag{std::move(help), absl::StrCat(*target), false,
                 [target, name](const std::string& v) {
                   if (!absl::SimpleAtod(v, target)) {
                     return absl::InvalidArgumentError(absl::StrCat(
                         "flag --", name, ": '", v, "' is not a number"));
                   }
                   return absl::OkStatus();
                 }});
}

void FlagSet::Bool(const std::string& name, bool* target, std::string help) {
  Add(name, Flag{std::move(help), *target ? "true" : "false", true,
                 [target, name](const std::string& v) {
                   if (v == "true" || v == "1" || v == "yes") {
                     *target = true;
                   } else if (v == "false" || v == "0" || v == "no") {
                     *target = false;
                   } else {
                     return absl::InvalidArgumentError(absl::StrCat(
                         "flag --", name, ": '", v, "' is not a boolean (true/false)"));
                   }
                   return absl::OkStatus();
                 }});
}

void FlagSet::StringList(const std::string& name, std::vector<std::string>* target,
                         std::string help) {
  Add(name, Flag{std::move(help), "", false, [target](const std::string& v) {
                   target->push_back(v);
                   return absl::OkStatus();
                 }});
}

void FlagSet::Alias(const std::string& alias, const std::string& name) {
  if (flags_.count(name) == 0 || flags_.count(alias) || aliases_.count(alias)) {
    std::fprintf(stderr, "FATAL: alias --%s for --%s\n", alias.c_str(), name.c_str());
    std::abort();
  }
  aliases_[alias] = name;
}

void FlagSet::Short(char letter, const std::string& name) {
  if (flags_.count(name) == 0 || shorts_.count(letter) || letter == 'h') {
    std::fprintf(stderr, "FATAL: short flag -%c for --%s\n", letter, name.c_str());
    std::abort();
  }
  shorts_[letter] = name;
}

void FlagSet::Hide(const std::string& name) {
  if (flags_.count(name) == 0) {
    std::fprintf(stderr, "FATAL: Hide of unregistered flag --%s\n", name.c_str());
    std::abort();
  }
  hidden_[name] = true;
}

void FlagSet::Version(std::string text) { version_ = std::move(text); }

std::map<std::string, FlagSet::Flag>::iterator FlagSet::Find(const std::string& given) {
  std::string name = given;
  std::replace(name.begin(), name.end(), '_', '-');
  if (auto a = aliases_.find(name); a != aliases_.end()) name = a->second;
  return flags_.find(name);
}

Status FlagSet::Unknown(const std::string& given) {
  std::vector<std::string> known;
  for (const auto& [name, flag] : flags_) {
    if (hidden_.count(name) == 0) known.push_back(name);
  }
  for (const auto& [alias, name] : aliases_) {
    if (hidden_.count(name) == 0) known.push_back(alias);
  }
  const size_t first = given.find_first_not_of('-');
  std::string bare = first == std::string::npos ? "" : given.substr(first);
  std::replace(bare.begin(), bare.end(), '_', '-');
  const std::string near = NearestMatch(bare, known);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown flag ", given, near.empty() ? "" : absl::StrCat(" (did you mean --", near, "?)"),
      " (see ", program_, " --help)"));
}

std::string NearestMatch(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (word[i - 1] != c[j - 1])});
        diagonal = up;
      }
    }
    size_t d = row[c.size()];
    if (word.size() >= 3 && c.compare(0, word.size(), word) == 0) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  const size_t allowed = std::max<size_t>(2, word.size() / 3);
  return best_distance <= allowed && best_distance < word.size() ? best : "";
}

StatusOr<std::vector<std::string>> FlagSet::Parse(int argc, const char* const* argv,
                                                  bool stop_at_first_positional) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return Parse(args, stop_at_first_positional);
}

StatusOr<std::vector<std::string>> FlagSet::Parse(const std::vector<std::string>& args,
                                                  bool stop_at_first_positional) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      if (stop_at_first_positional) {
        positional.insert(positional.end(), args.begin() + i + 1, args.end());
        break;
      }
      continue;
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    if (body == "help" || body == "h") return absl::NotFoundError(Usage());
    if (body == "version" && !version_.empty()) return absl::NotFoundError(version_ + "\n");
    if (arg[1] != '-' && body.size() == 1) {  // -x
      auto s = shorts_.find(body[0]);
      if (s == shorts_.end()) return Unknown(arg);
      body = s->second;
    }
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (auto eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    auto it = Find(name);
    if (it == flags_.end() && !has_value && name.rfind("no-", 0) == 0) {
      auto neg = Find(name.substr(3));
      if (neg != flags_.end() && neg->second.is_bool) {
        RETURN_IF_ERROR(neg->second.set("false"));
        set_[neg->first] = true;
        continue;
      }
    }
    if (it == flags_.end()) return Unknown(arg[1] == '-' ? "--" + name : arg);
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", it->first, " needs a value"));
      }
    }
    RETURN_IF_ERROR(it->second.set(value));
    set_[it->first] = true;
  }
  return positional;
}

bool FlagSet::WasSet(const std::string& name) const { return set_.count(name) > 0; }

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", program_, " [flags]\n", summary_, "\n\nflags:\n");
  for (const auto& [name, flag] : flags_) {
    if (hidden_.count(name) != 0) continue;
    std::string spelled = "--" + name;
    for (const auto& [letter, target] : shorts_) {
      if (target == name) spelled = absl::StrCat("-", std::string(1, letter), ", ", spelled);
    }
    for (const auto& [alias, target] : aliases_) {
      if (target == name) absl::StrAppend(&spelled, ", --", alias);
    }
    absl::StrAppendFormat(&out, "  %-26s %s", spelled, flag.help);
    // A help text that states its own default (a 0 that means "the
    // daemon's default") is not contradicted by the variable's value.
    if (!flag.default_text.empty() && flag.help.find("default") == std::string::npos) {
      absl::StrAppend(&out, " (default: ", flag.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  if (!version_.empty()) absl::StrAppendFormat(&out, "  %-26s %s\n", "--version", "print the version");
  return out;
}

int FlagSet::ReportParseError(const Status& status) {
  const bool help = absl::IsNotFound(status);
  std::fprintf(help ? stdout : stderr, "%s\n", std::string(status.message()).c_str());
  return help ? 0 : 2;
}

}  // namespace lockstep
