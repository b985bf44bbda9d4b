#include "daemon/token_files.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/token.h"

namespace lockstep {
namespace daemon {

TokenFiles::TokenFiles(std::vector<std::string> paths, Apply apply)
    : paths_(std::move(paths)), apply_(std::move(apply)) {}

Status TokenFiles::Load() {
  // Identities first: a file replaced while it is read shows as changed at
  // the next check and is read again.
  std::vector<std::string> identities = Identities();
  std::vector<std::vector<std::string>> tokens;
  for (const std::string& path : paths_) {
    ASSIGN_OR_RETURN(std::vector<std::string> t, LoadTokens(path, /*create=*/false));
    tokens.push_back(std::move(t));
  }
  apply_(tokens);
  loaded_ = std::move(identities);
  return absl::OkStatus();
}

bool TokenFiles::Changed() const { return Identities() != loaded_; }

std::vector<std::string> TokenFiles::Identities() const {
  std::vector<std::string> out;
  for (const std::string& path : paths_) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      out.emplace_back("missing");
      continue;
    }
    // Mode, owner and ctime too: a chmod or chown alone (a token file made
    // readable by others) is a change, re-checked and logged.
    out.push_back(absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec,
                               ".", st.st_mtim.tv_nsec, ":", st.st_mode, ":", st.st_uid, ":",
                               st.st_gid, ":", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec));
  }
  return out;
}

}  // namespace daemon
}  // namespace lockstep
