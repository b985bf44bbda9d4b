#include "common/flags.h"

#include <cstdio>

#include <cerrno>
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
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (auto eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end() && !has_value && name.rfind("no-", 0) == 0) {
      auto neg = flags_.find(name.substr(3));
      if (neg != flags_.end() && neg->second.is_bool) {
        RETURN_IF_ERROR(neg->second.set("false"));
        set_[neg->first] = true;
        continue;
      }
    }
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", program_, " --help)"));
    }
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    RETURN_IF_ERROR(it->second.set(value));
    set_[name] = true;
  }
  return positional;
}

bool FlagSet::WasSet(const std::string& name) const { return set_.count(name) > 0; }

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", program_, " [flags]\n", summary_, "\n\nflags:\n");
  for (const auto& [name, flag] : flags_) {
    absl::StrAppendFormat(&out, "  --%-24s %s", name, flag.help);
    if (!flag.default_text.empty()) absl::StrAppend(&out, " (default: ", flag.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

int FlagSet::ReportParseError(const Status& status) {
  const bool help = absl::IsNotFound(status);
  std::fprintf(help ? stdout : stderr, "%s\n", std::string(status.message()).c_str());
  return help ? 0 : 2;
}

}  // namespace lockstep
