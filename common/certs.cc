#include "common/certs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/openssl_ptr.h"

namespace lockstep {
namespace certs {
namespace {

// An IPv4 or IPv6 address, or a DNS name: dot-separated labels of letters,
// digits, hyphens (not first or last) and underscores, 1-63 bytes each and
// 253 in all. Either is also a safe file name for its certificate.
bool IsDnsNameOrIp(const std::string& host) {
  unsigned char addr[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), addr) == 1 || inet_pton(AF_INET6, host.c_str(), addr) == 1) {
    return true;
  }
  if (host.empty() || host.size() > 253) return false;
  for (size_t start = 0;;) {
    const size_t dot = host.find('.', start);
    const size_t end = dot == std::string::npos ? host.size() : dot;
    if (end == start || end - start > 63 || host[start] == '-' || host[end - 1] == '-') {
      return false;
    }
    for (size_t i = start; i < end; ++i) {
      const char c = host[i];
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_';
      if (!ok) return false;
    }
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

using openssl::Bignum;
using openssl::Bio;
using openssl::Pkey;
using openssl::X509Ext;
using openssl::X509Ptr;
using openssl::X509StoreCtx;
using openssl::X509StorePtr;

Status SslError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", OpenSslErrors()));
}

StatusOr<Pkey> NewKey() {
  Pkey key(EVP_EC_gen("P-256"));
  if (!key) return SslError("generating an EC P-256 key");
  return key;
}

StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr)) {
    return SslError("writing a key as PEM");
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n);
}

StatusOr<std::string> CertPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert)) return SslError("writing a certificate as PEM");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n);
}

StatusOr<X509Ptr> ParseCert(const std::string& pem, const std::string& what) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a PEM certificate"));
  }
  return cert;
}

StatusOr<Pkey> ParseKey(const std::string& pem, const std::string& what) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Pkey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not an unencrypted PEM private key"));
  }
  return key;
}

std::string FormatTime(const ASN1_TIME* t) {
  Bio bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n);
}

Status AddExtension(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value) {
  X509Ext ext(X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str()));
  if (!ext || !X509_add_ext(cert, ext.get(), -1)) {
    return SslError(absl::StrCat("adding extension ", OBJ_nid2sn(nid), "=", value));
  }
  return absl::OkStatus();
}

// "IP:10.0.0.2" for an address literal, else "DNS:name".
std::string SanEntry(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned char buf[16];
  if (inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1) {
    return "IP:" + host;
  }
  return "DNS:" + host;
}

// A certificate for `key` named `cn`, issued by `issuer` (null: itself)
// and signed with `signer`; `extensions` are (nid, value) pairs.
StatusOr<X509Ptr> BuildCert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* signer,
                            SystemTime not_before, SystemTime not_after,
                            const std::vector<std::pair<int, std::string>>& extensions) {
  if (not_after <= not_before) {
    return absl::InvalidArgumentError(absl::StrCat("certificate ", cn, ": not_after is not after not_before"));
  }
  X509Ptr cert(X509_new());
  X509_set_version(cert.get(), 2);  // v3
  Bignum serial(BN_new());
  if (!BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get()))) {
    return SslError("choosing a serial number");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("lockstep"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  const time_t nb = std::chrono::system_clock::to_time_t(not_before);
  const time_t na = std::chrono::system_clock::to_time_t(not_after);
  if (!ASN1_TIME_set(X509_getm_notBefore(cert.get()), nb) ||
      !ASN1_TIME_set(X509_getm_notAfter(cert.get()), na)) {
    return SslError("setting the validity period");
  }
  if (!X509_set_pubkey(cert.get(), key)) return SslError("setting the public key");
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer ? issuer : cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions) {
    RETURN_IF_ERROR(AddExtension(cert.get(), &ctx, nid, value));
  }
  if (!X509_sign(cert.get(), signer, EVP_sha256())) return SslError("signing " + cn);
  return cert;
}

// Writes `data` to `path` with `mode` through `path`.tmp and a rename.
Status WriteFileAtomically(const std::string& path, const std::string& data, mode_t mode) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("writing ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);  // the umask may have narrowed it
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("writing ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string OpenSslErrors() {
  std::vector<std::string> parts;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    parts.emplace_back(buf);
  }
  return parts.empty() ? "no OpenSSL error queued" : absl::StrJoin(parts, "; ");
}

namespace {

// A CA found in `dir` signs this cluster's certificates only if nobody else
// could have put it there or can read its key, it is a CA, and it outlives
// the certificates it is asked to sign.
Status CheckReusableCa(const std::string& dir, const std::string& key_path,
                       const std::string& cert_pem, SystemTime not_after) {
  const uid_t me = ::geteuid();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("stat ", dir, ": ", std::strerror(errno)));
  }
  if ((st.st_uid != me && st.st_uid != 0) || (st.st_mode & 022) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s holds a CA but is owned by uid %d, mode %04o: whoever else can write there could "
        "have put that CA there, or swap the keys written next to it; use a directory only you "
        "can write", dir, st.st_uid, st.st_mode & 07777));
  }
  if (::stat(key_path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("stat ", key_path, ": ", std::strerror(errno)));
  }
  if (st.st_uid != me || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s is owned by uid %d, mode %04o: a CA key another user owns or can read can sign "
        "certificates for this cluster; chown it to uid %d and chmod 600 it, or move ca.pem and "
        "ca.key away to make a new CA", key_path, st.st_uid, st.st_mode & 07777, me));
  }
  ASSIGN_OR_RETURN(X509Ptr cert, ParseCert(cert_pem, dir + "/ca.pem"));
  if (X509_check_ca(cert.get()) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, "/ca.pem is not a CA certificate: it cannot sign the cluster's"));
  }
  const std::time_t wanted = std::chrono::system_clock::to_time_t(not_after);
  if (X509_cmp_time(X509_get0_notAfter(cert.get()), const_cast<std::time_t*>(&wanted)) < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CA in ", dir, " expires ", FormatTime(X509_get0_notAfter(cert.get())),
        ", before the certificates asked for would: ask for fewer --days, or move ca.pem and "
        "ca.key away to make a new CA (and give every node the new ca.pem)"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<KeyAndCert> MakeCa(const std::string& common_name, SystemTime not_before,
                            SystemTime not_after) {
  ASSIGN_OR_RETURN(Pkey key, NewKey());
  ASSIGN_OR_RETURN(X509Ptr cert,
                   BuildCert(key.get(), common_name, nullptr, key.get(), not_before, not_after,
                             {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                              {NID_key_usage, "critical,keyCertSign,cRLSign"},
                              {NID_subject_key_identifier, "hash"}}));
  KeyAndCert out;
  ASSIGN_OR_RETURN(out.key_pem, KeyPem(key.get()));
  ASSIGN_OR_RETURN(out.cert_pem, CertPem(cert.get()));
  return out;
}

StatusOr<KeyAndCert> IssueCert(const KeyAndCert& ca, const CertOptions& options) {
  ASSIGN_OR_RETURN(X509Ptr ca_cert, ParseCert(ca.cert_pem, "the CA certificate"));
  ASSIGN_OR_RETURN(Pkey ca_key, ParseKey(ca.key_pem, "the CA key"));
  std::vector<std::pair<int, std::string>> ext = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
      {NID_subject_key_identifier, "hash"},
      {NID_authority_key_identifier, "keyid"}};
  std::vector<std::string> usage;
  if (options.server_auth) usage.push_back("serverAuth");
  if (options.client_auth) usage.push_back("clientAuth");
  if (!usage.empty()) ext.emplace_back(NID_ext_key_usage, absl::StrJoin(usage, ","));
  std::vector<std::string> san;
  for (const std::string& host : options.hosts) {
    if (host.empty()) return absl::InvalidArgumentError("an empty host name");
    san.push_back(SanEntry(host));
  }
  if (!san.empty()) ext.emplace_back(NID_subject_alt_name, absl::StrJoin(san, ","));
  ASSIGN_OR_RETURN(Pkey key, NewKey());
  ASSIGN_OR_RETURN(X509Ptr cert, BuildCert(key.get(), options.common_name, ca_cert.get(),
                                           ca_key.get(), options.not_before, options.not_after,
                                           ext));
  KeyAndCert out;
  ASSIGN_OR_RETURN(out.key_pem, KeyPem(key.get()));
  ASSIGN_OR_RETURN(out.cert_pem, CertPem(cert.get()));
  return out;
}

StatusOr<std::vector<std::string>> WriteClusterCerts(const std::string& dir,
                                                     const std::vector<std::string>& hosts,
                                                     int days) {
  if (hosts.empty()) return absl::InvalidArgumentError("no hosts: name every node's address");
  if (days < 1 || days > kMaxCertDays) {
    return absl::InvalidArgumentError(
        absl::StrCat("days must be 1 to ", kMaxCertDays, " (100 years), got ", days));
  }
  for (const std::string& host : hosts) {
    if (host == "ca" || host == "client" || host == "worker") {
      return absl::InvalidArgumentError(absl::StrCat(
          "host '", host, "' would overwrite the ", host, " certificate (want a DNS name or an "
          "IP address of a node)"));
    }
    if (!IsDnsNameOrIp(host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host '", absl::CHexEscape(host), "' is neither a DNS name nor an IP address"));
    }
  }
  // As `mkdir -p`: /etc/lockstep/tls on a host that has no /etc/lockstep.
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string part = dir.substr(0, slash);
    if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      const int err = errno;
      const std::string why = absl::StrCat("mkdir ", part, ": ", std::strerror(err));
      return err == EACCES || err == EPERM || err == EROFS ? absl::PermissionDeniedError(why)
                                                           : absl::FailedPreconditionError(why);
    }
    if (slash == std::string::npos) break;
  }
  const auto now = std::chrono::system_clock::now();
  // Backdated an hour: clocks across a cluster are not exactly equal.
  const SystemTime not_before = now - std::chrono::hours(1);
  const SystemTime not_after = now + std::chrono::hours(24) * days;
  const std::string ca_cert_path = dir + "/ca.pem";
  const std::string ca_key_path = dir + "/ca.key";
  std::vector<std::string> written;
  KeyAndCert ca;
  auto old_key = ReadFile(ca_key_path);
  auto old_cert = ReadFile(ca_cert_path);
  if (old_key.ok() && old_cert.ok()) {
    RETURN_IF_ERROR(CheckReusableCa(dir, ca_key_path, *old_cert, not_after));
    ca.key_pem = *old_key;
    ca.cert_pem = *old_cert;
  } else {
    ASSIGN_OR_RETURN(ca, MakeCa("lockstep cluster CA", not_before,
                                now + std::chrono::hours(24) * (days + 365)));
    RETURN_IF_ERROR(WriteFileAtomically(ca_key_path, ca.key_pem, 0600));
    RETURN_IF_ERROR(WriteFileAtomically(ca_cert_path, ca.cert_pem, 0644));
    written.push_back(ca_cert_path);
    written.push_back(ca_key_path);
  }
  auto issue = [&](const std::string& name, CertOptions options) -> Status {
    options.not_before = not_before;
    options.not_after = not_after;
    ASSIGN_OR_RETURN(KeyAndCert leaf, IssueCert(ca, options));
    const std::string base = dir + "/" + name;
    // Key first: a watcher that sees the new certificate then finds its key.
    RETURN_IF_ERROR(WriteFileAtomically(base + ".key", leaf.key_pem, 0600));
    RETURN_IF_ERROR(WriteFileAtomically(base + ".pem", leaf.cert_pem, 0644));
    written.push_back(base + ".pem");
    written.push_back(base + ".key");
    return absl::OkStatus();
  };
  for (const std::string& host : hosts) {
    CertOptions options;
    options.common_name = host;
    options.hosts = {host};
    RETURN_IF_ERROR(issue(host, options));
  }
  CertOptions client;
  client.common_name = "lockstep client";
  client.server_auth = false;
  RETURN_IF_ERROR(issue("client", client));
  CertOptions worker;
  worker.common_name = "lockstep worker";
  worker.server_auth = false;
  RETURN_IF_ERROR(issue("worker", worker));
  return written;
}

Status CheckTlsMaterial(const std::string& ca_pem, const std::string& cert_pem,
                        const std::string& key_pem, SystemTime now, const std::string& ca_what,
                        const std::string& cert_what, const std::string& key_what) {
  ASSIGN_OR_RETURN(X509Ptr ca, ParseCert(ca_pem, ca_what));
  if (cert_pem.empty() && key_pem.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(X509Ptr cert, ParseCert(cert_pem, cert_what));
  ASSIGN_OR_RETURN(Pkey key, ParseKey(key_pem, key_what));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(key_what, " is not the key of the certificate ", cert_what));
  }
  X509StorePtr store(X509_STORE_new());
  X509_STORE_add_cert(store.get(), ca.get());
  X509StoreCtx ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr);
  X509_STORE_CTX_set_time(ctx.get(), 0, std::chrono::system_clock::to_time_t(now));
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    std::string why = X509_verify_cert_error_string(err);
    if (err == X509_V_ERR_CERT_HAS_EXPIRED) {
      why += " at " + FormatTime(X509_get0_notAfter(cert.get()));
    } else if (err == X509_V_ERR_CERT_NOT_YET_VALID) {
      why += " (valid from " + FormatTime(X509_get0_notBefore(cert.get())) + ")";
    } else if (err == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
               err == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT) {
      why += " (it was not issued by " + ca_what + ")";
    }
    return absl::InvalidArgumentError(absl::StrCat("certificate ", cert_what, ": ", why));
  }
  return absl::OkStatus();
}

Status CheckClientOnly(const std::string& cert_pem, const std::string& what) {
  ASSIGN_OR_RETURN(X509Ptr cert, ParseCert(cert_pem, what));
  // Computes the cached extension flags; 0 for a certificate OpenSSL
  // cannot interpret.
  const uint32_t flags = X509_get_extension_flags(cert.get());
  if ((flags & EXFLAG_INVALID) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("certificate ", what, ": invalid extensions"));
  }
  if ((flags & EXFLAG_XKUSAGE) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate ", what,
                     " has no extendedKeyUsage, so it is good for a server too; give one for "
                     "clientAuth only (lockstep certs writes worker.pem)"));
  }
  const uint32_t usage = X509_get_extended_key_usage(cert.get());
  if ((usage & (XKU_SSL_SERVER | XKU_ANYEKU)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate ", what,
                     " is good for a server (extendedKeyUsage serverAuth): a worker holding its "
                     "key could pass for a node; give one for clientAuth only (lockstep certs "
                     "writes worker.pem)"));
  }
  if ((usage & XKU_SSL_CLIENT) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate ", what, " lacks extendedKeyUsage clientAuth: servers would refuse it"));
  }
  return absl::OkStatus();
}

}  // namespace certs
}  // namespace lockstep
