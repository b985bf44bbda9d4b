// Command-line flags for the binaries. Flags are declared only in a
// binary's *_main.cc, registered on a FlagSet, and parsed into the binary's
// config struct; there is no global flag registry.
//
//   FlagSet flags("lockstepd", "Lockstep daemon");
//   std::string state_dir = "/var/lib/lockstep";
//   flags.String("state-dir", &state_dir, "where jobs and logs are kept");
//   ASSIGN_OR_RETURN(std::vector<std::string> rest, flags.Parse(argc, argv));
//
// Accepted forms: --name=value, --name value, --bool-flag, --no-bool-flag,
// -x value for a registered one-letter form (Short), and "--" to end flags
// (everything after is returned as positional). Underscores count as
// dashes (--max_restarts is --max-restarts), and Alias adds other
// spellings (torchrun's --nnodes). An unknown flag's error suggests the
// nearest known one.
// Thread safety: not thread-safe; use from main only.
#ifndef LOCKSTEP_COMMON_FLAGS_H_
#define LOCKSTEP_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {

class FlagSet {
 public:
  FlagSet(std::string program, std::string summary);

  // Each call registers --name bound to *target; the target's value before
  // Parse is the default shown in Usage(). REQUIRES: name is new.
  void String(const std::string& name, std::string* target, std::string help);
  void Int(const std::string& name, int64_t* target, std::string help);
  void Int32(const std::string& name, int32_t* target, std::string help);
  void Double(const std::string& name, double* target, std::string help);
  void Bool(const std::string& name, bool* target, std::string help);
  // Repeatable flag: each occurrence appends.
  void StringList(const std::string& name, std::vector<std::string>* target,
                  std::string help);

  // Another spelling of the registered flag `name`, shown in Usage().
  void Alias(const std::string& alias, const std::string& name);
  // `-letter` for the registered flag `name`.
  void Short(char letter, const std::string& name);
  // The registered flag `name` is still parsed (so the caller can refuse it
  // with a message of its own, as `lockstep run` does the cluster flags it
  // shares with submit) but neither listed in Usage() nor suggested for a
  // misspelt flag.
  void Hide(const std::string& name);
  // Makes --version return NotFound with `text` as the message (as --help
  // does with Usage()), so ReportParseError prints it and returns 0.
  void Version(std::string text);

  // Parses argv[1..]. Returns the positional arguments in order (flags may
  // be interleaved with them until "--"; with `stop_at_first_positional`,
  // parsing stops at the first positional, for subcommands).
  // Errors (InvalidArgument, naming the flag): unknown flag, missing value,
  // a value that does not parse. "--help" returns NotFound with Usage() as
  // the message so the caller can print it and exit 0.
  StatusOr<std::vector<std::string>> Parse(int argc, const char* const* argv,
                                           bool stop_at_first_positional = false);
  StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args,
                                           bool stop_at_first_positional = false);

  // What a main returns when Parse failed: for --help (NotFound) prints the
  // usage to stdout and returns 0; otherwise prints the error, which names
  // the flag, to stderr and returns 2.
  //   auto rest = flags.Parse(argc, argv);
  //   if (!rest.ok()) return FlagSet::ReportParseError(rest.status());
  static int ReportParseError(const Status& status);

  // True if the flag was given on the command line (not just defaulted).
  bool WasSet(const std::string& name) const;

  std::string Usage() const;

 private:
  struct Flag {
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<Status(const std::string&)> set;
  };
  void Add(const std::string& name, Flag flag);

  // The flag `name` (a registered name, alias or underscore spelling) is
  // known as, or flags_.end().
  std::map<std::string, Flag>::iterator Find(const std::string& name);
  Status Unknown(const std::string& given);

  std::string program_;
  std::string summary_;
  std::string version_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, std::string> aliases_;  // alias -> name
  std::map<char, std::string> shorts_;          // letter -> name
  std::map<std::string, bool> set_;
  std::map<std::string, bool> hidden_;
};

// The candidate nearest to `word` (edit distance, or `word` a prefix of
// it) when near enough to be what was meant, else "". For "did you mean".
std::string NearestMatch(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_FLAGS_H_
