#include "daemon/token.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {

StatusOr<std::string> LoadToken(const std::string& path, bool create) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || !create) {
      return absl::NotFoundError(absl::StrCat("token file ", path, ": ", std::strerror(errno)));
    }
    std::random_device rd;
    std::string token;
    static const char kHex[] = "0123456789abcdef";
    for (int i = 0; i < 32; ++i) {
      unsigned b = rd() & 0xff;
      token += kHex[b >> 4];
      token += kHex[b & 15];
    }
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno != EEXIST) {
        return absl::PermissionDeniedError(
            absl::StrCat("token file ", path, ": cannot create: ", std::strerror(errno)));
      }
      return LoadToken(path, false);  // lost a race with another starter
    }
    std::string line = token + "\n";
    bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ok = (::fsync(fd) == 0) && ok;
    ::close(fd);
    if (!ok) return absl::UnavailableError(absl::StrCat("token file ", path, ": write failed"));
    return token;
  }
  if (st.st_mode & 077) {
    return absl::PermissionDeniedError(absl::StrCat(
        "token file ", path, " is readable by group or others (mode ",
        absl::StrCat(absl::Hex(st.st_mode & 0777)), "); chmod 600 it"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat("token file ", path, ": cannot read"));
  }
  std::string token;
  std::getline(in, token);
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

Status CheckBearer(absl::string_view value, bool present, const std::string& token) {
  if (!present) {
    return absl::UnauthenticatedError(
        "missing `authorization: Bearer <token>` metadata (see --token-file)");
  }
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!absl::StartsWith(value, kPrefix)) {
    return absl::UnauthenticatedError("authorization metadata is not a Bearer token");
  }
  absl::string_view got = value.substr(kPrefix.size());
  unsigned diff = got.size() ^ token.size();
  for (size_t i = 0; i < got.size(); ++i) {
    diff |= static_cast<unsigned char>(got[i]) ^
            static_cast<unsigned char>(token.empty() ? 0 : token[i % token.size()]);
  }
  if (diff != 0 || token.empty()) return absl::UnauthenticatedError("wrong bearer token");
  return absl::OkStatus();
}

}  // namespace daemon
}  // namespace lockstep
