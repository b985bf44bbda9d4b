// TokenFiles: the token files a lockstepd reads, read again when asked
// (SIGHUP) or when one of them changed on disk, so tokens rotate without a
// restart (daemon/README.md, Rotating tokens).
//
// A coordinator watches its admin, viewer and agent files; an agent-only
// daemon the --token-file it presents. Each successful load hands every
// file's tokens (token.h: the current one first) to `apply`. A load that
// fails (a file missing, emptied, too open, too large) applies nothing:
// the tokens in use stay, and the error names the file.
//
// Thread safety: not thread-safe; lockstepd's main thread owns it.
#ifndef LOCKSTEP_DAEMON_TOKEN_FILES_H_
#define LOCKSTEP_DAEMON_TOKEN_FILES_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace daemon {

// How often lockstepd looks for changed token files.
inline constexpr std::chrono::seconds kTokenCheckInterval{5};

class TokenFiles {
 public:
  // Gets one token list per path, in the order of `paths`.
  using Apply = std::function<void(const std::vector<std::vector<std::string>>& tokens)>;

  TokenFiles(std::vector<std::string> paths, Apply apply);

  // Reads every file (creating none) and, if all load, applies them and
  // remembers what was read (Changed compares with it).
  Status Load();
  // Whether any file differs from what the last successful Load read
  // (another inode, size or modification time; a file gone counts).
  bool Changed() const;
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::vector<std::string> Identities() const;

  const std::vector<std::string> paths_;
  const Apply apply_;
  std::vector<std::string> loaded_;  // Identities() at the last Load
};

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_TOKEN_FILES_H_
