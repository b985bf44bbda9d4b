#include "daemon/token.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/unique_fd.h"

namespace lockstep {
namespace daemon {

StatusOr<std::string> LoadToken(const std::string& path, bool create) {
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, LoadTokens(path, create));
  return tokens.front();
}

StatusOr<std::vector<std::string>> LoadTokens(const std::string& path, bool create) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || !create) {
      return absl::NotFoundError(absl::StrCat("token file ", path, ": ", std::strerror(errno)));
    }
    const std::string token = NewSecret("");
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno != EEXIST) {
        return absl::PermissionDeniedError(
            absl::StrCat("token file ", path, ": cannot create: ", std::strerror(errno)));
      }
      return LoadTokens(path, false);  // lost a race with another starter
    }
    std::string line = token + "\n";
    bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ok = (::fsync(fd) == 0) && ok;
    ::close(fd);
    if (!ok) return absl::UnavailableError(absl::StrCat("token file ", path, ": write failed"));
    return std::vector<std::string>{token};
  }
  // Judged on the file that is read (a symlink is followed: a Kubernetes
  // Secret volume is made of them), through one descriptor, so the file
  // checked is the file read.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("token file ", path, ": cannot read: ", std::strerror(errno)));
  }
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat("token file ", path, " is not a regular file"));
  }
  if (st.st_mode & 077) {
    return absl::PermissionDeniedError(absl::StrCat(
        "token file ", path, " is readable by group or others (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), "); chmod 600 it"));
  }
  // Root's is trusted (root can read and change every file anyway).
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "token file ", path, " is owned by uid ", st.st_uid, ", not by this process's uid ",
        ::geteuid(), ": whoever owns it can change the token; chown it"));
  }
  std::string content(kMaxTokenFileBytes + 1, '\0');
  const ssize_t n = ::read(fd.get(), content.data(), content.size());
  if (n < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("token file ", path, ": cannot read: ", std::strerror(errno)));
  }
  if (static_cast<size_t>(n) > kMaxTokenFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is over ",
                                                   kMaxTokenFileBytes, " bytes"));
  }
  content.resize(static_cast<size_t>(n));
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line.size() < kMinTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, ", line ", line_number, ": a token of ", line.size(),
          " characters; at least ", kMinTokenChars,
          " are needed (make one with: openssl rand -hex 32)"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return tokens;
}

std::string HmacSha256Hex(absl::string_view key, absl::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  unsigned char* ok =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_len);
  if (ok == nullptr) std::abort();  // only on allocation failure inside libcrypto
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * mac_len);
  for (unsigned int i = 0; i < mac_len; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

std::string JobStoreToken(absl::string_view store_key, absl::string_view job_id) {
  return HmacSha256Hex(store_key, job_id);
}

Status AuthorizeStore(absl::string_view value, bool present, const std::string& store_key,
                      absl::string_view ns) {
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!present || !absl::StartsWith(value, kPrefix)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "store namespace ", QuoteForError(ns),
        ": missing `authorization: Bearer <token>` metadata (workers get LOCKSTEP_STORE_TOKEN)"));
  }
  absl::string_view got = value.substr(kPrefix.size());
  absl::string_view job = ns.substr(0, ns.find('/'));
  if (!store_key.empty() && !job.empty() && SecretsEqual(got, JobStoreToken(store_key, job))) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("store token does not open namespace ", QuoteForError(ns), " (job ",
                   QuoteForError(job), ")"));
}

std::string NewSecret(absl::string_view prefix) {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::fprintf(stderr, "lockstep: OpenSSL's RAND_bytes failed: no secret can be made\n");
    std::abort();
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out(prefix);
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace daemon
}  // namespace lockstep
