#include "rendezvous/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/address.h"
#include "common/certs.h"
#include "common/mutex.h"
#include "common/openssl_ptr.h"
#include "common/unique_fd.h"
#include "common/worker_env.h"

namespace lockstep {
namespace rendezvous {

StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read: ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": the file is empty"));
  }
  return text;
}

namespace {

unsigned RefreshSeconds(const TlsConfig& config) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(config.refresh_interval).count();
  return static_cast<unsigned>(std::max<int64_t>(s, 1));
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(
    const TlsConfig& config) {
  if (!config.ca_file.empty()) {
    if (!config.has_identity()) {
      return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          config.ca_file, RefreshSeconds(config));
    }
    return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        config.key_file, config.cert_file, config.ca_file, RefreshSeconds(config));
  }
  std::vector<grpc::experimental::IdentityKeyCertPair> identity;
  if (config.has_identity()) identity.push_back({config.key_pem, config.cert_pem});
  return std::make_shared<grpc::experimental::StaticDataCertificateProvider>(config.ca_pem,
                                                                             identity);
}

struct ProcessState {
  Mutex mu;
  TlsConfig config ABSL_GUARDED_BY(mu);
  std::shared_ptr<grpc::ServerCredentials> server ABSL_GUARDED_BY(mu);
  std::shared_ptr<grpc::ChannelCredentials> channel ABSL_GUARDED_BY(mu);
};

// Starts from the worker contract's LOCKSTEP_TLS_*_PEM, so a worker's
// clients (store, progress reporter) use what the agent gave it.
ProcessState& State() {
  static auto* state = [] {
    auto* s = new ProcessState;
    const WorkerTlsPem pem = ReadWorkerTlsPem(std::getenv);
    MutexLock lock(&s->mu);
    s->config.ca_pem = pem.ca;
    s->config.cert_pem = pem.cert;
    s->config.key_pem = pem.key;
    return s;
  }();
  return *state;
}

// ---- ExplainTlsFailure's own handshake ----

using SslCtx = std::unique_ptr<SSL_CTX, openssl::Deleter<SSL_CTX, SSL_CTX_free>>;
using Ssl = std::unique_ptr<SSL, openssl::Deleter<SSL, SSL_free>>;
using openssl::Bio;
using openssl::Pkey;
using openssl::X509Ptr;

// A TCP connection to host:port within `timeout`, reads and writes bounded
// by it too; -1 if none.
int ConnectTcp(const std::string& host, const std::string& port, Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      rc = (::poll(&p, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
            err == 0)
               ? 0
               : -1;
    }
    if (rc != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return -1;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

// Blocks SIGPIPE on this thread while alive, and discards one that a write
// to a peer that hung up raised meanwhile (OpenSSL writes with write(2),
// not send(MSG_NOSIGNAL)).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Loads config's CA and identity into `ctx`; false if one does not load.
bool LoadMaterial(SSL_CTX* ctx, const TlsConfig& config) {
  std::string ca = config.ca_pem, cert = config.cert_pem, key = config.key_pem;
  if (!config.ca_file.empty()) {
    auto c = ReadPem(config.ca_file, "");
    if (!c.ok()) return false;
    ca = *c;
    if (config.has_identity()) {
      auto cc = ReadPem(config.cert_file, "");
      auto kk = ReadPem(config.key_file, "");
      if (!cc.ok() || !kk.ok()) return false;
      cert = *cc;
      key = *kk;
    }
  }
  Bio ca_bio(BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size())));
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  while (X509* c = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, c);
    X509_free(c);
  }
  ERR_clear_error();
  if (!cert.empty()) {
    Bio cert_bio(BIO_new_mem_buf(cert.data(), static_cast<int>(cert.size())));
    X509Ptr x(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
    Bio key_bio(BIO_new_mem_buf(key.data(), static_cast<int>(key.size())));
    Pkey k(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    if (!x || !k || SSL_CTX_use_certificate(ctx, x.get()) != 1 ||
        SSL_CTX_use_PrivateKey(ctx, k.get()) != 1) {
      ERR_clear_error();
      return false;
    }
  }
  return true;
}

// What an alert or error from the handshake means for the operator.
std::string Meaning(const std::string& reason, bool have_identity) {
  if (absl::StrContains(reason, "certificate required") ||
      (!have_identity && absl::StrContains(reason, "handshake failure"))) {
    return "the server requires a client certificate and this side sent none (give --tls-cert "
           "and --tls-key, or LOCKSTEP_TLS_CERT and LOCKSTEP_TLS_KEY)";
  }
  if (absl::StrContains(reason, "unknown ca")) {
    return "the server does not trust this side's certificate: it was not issued by the "
           "server's CA (is --tls-cert from this cluster's `lockstep certs`?)";
  }
  if (absl::StrContains(reason, "certificate expired")) {
    return "the server refused this side's certificate: it has expired (renew it with "
           "`lockstep certs`)";
  }
  if (absl::StrContains(reason, "wrong version number") ||
      absl::StrContains(reason, "packet length too long") ||
      absl::StrContains(reason, "record layer failure")) {
    return "the server does not speak TLS (a lockstepd started without --tls-ca?)";
  }
  return reason;
}

std::string VerifyHint(long v) {
  switch (v) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return " (is --tls-ca the cluster's CA?)";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return " (the server's certificate does not name the address dialled: list it in "
             "`lockstep certs --hosts`)";
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return " (renew the server's certificate with `lockstep certs`)";
    default:
      return "";
  }
}

}  // namespace

Status CheckTlsConfig(const TlsConfig& config, bool need_identity,
                      const std::string& flag_prefix) {
  const std::string ca_flag = flag_prefix + "ca", cert_flag = flag_prefix + "cert",
                    key_flag = flag_prefix + "key";
  const bool from_files =
      !config.ca_file.empty() || !config.cert_file.empty() || !config.key_file.empty();
  const bool has_cert = !config.cert_file.empty() || !config.cert_pem.empty();
  const bool has_key = !config.key_file.empty() || !config.key_pem.empty();
  if (!config.enabled()) {
    if (has_cert || has_key) {
      return absl::InvalidArgumentError(absl::StrCat(
          cert_flag, " and ", key_flag, " need ", ca_flag, " (the cluster CA that checks peers)"));
    }
    return absl::OkStatus();
  }
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_flag, " and ", key_flag, " go together: give both or neither"));
  }
  if (need_identity && !has_cert) {
    return absl::InvalidArgumentError(absl::StrCat(
        ca_flag, " needs ", cert_flag, " and ", key_flag, ": a server presents a certificate"));
  }
  std::string ca = config.ca_pem, cert = config.cert_pem, key = config.key_pem;
  std::string ca_what = "LOCKSTEP_TLS_CA_PEM", cert_what = "LOCKSTEP_TLS_CERT_PEM",
              key_what = "LOCKSTEP_TLS_KEY_PEM";
  if (from_files) {
    ASSIGN_OR_RETURN(ca, ReadPem(config.ca_file, ca_flag));
    ca_what = absl::StrCat(ca_flag, " ", config.ca_file);
    if (has_cert) {
      ASSIGN_OR_RETURN(cert, ReadPem(config.cert_file, cert_flag));
      ASSIGN_OR_RETURN(key, ReadPem(config.key_file, key_flag));
      // As ssh treats a private key: one others can read (a job of another
      // uid on this node, say) lets them pass for this node.
      struct stat st;
      if (::stat(config.key_file.c_str(), &st) == 0 && (st.st_mode & 007) != 0) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "%s %s is mode %04o, open to every user of this host: chmod 600 it (640 for a group "
            "that must read it)", key_flag, config.key_file, st.st_mode & 07777));
      }
      cert_what = absl::StrCat(cert_flag, " ", config.cert_file);
      key_what = absl::StrCat(key_flag, " ", config.key_file);
    }
  }
  return certs::CheckTlsMaterial(ca, cert, key, std::chrono::system_clock::now(), ca_what,
                                 cert_what, key_what);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(config));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(config));
  options.watch_root_certs();
  if (config.has_identity()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

void SetProcessTls(const TlsConfig& config) {
  ProcessState& s = State();
  MutexLock lock(&s.mu);
  s.config = config;
  s.server.reset();
  s.channel.reset();
}

TlsConfig ProcessTls() {
  ProcessState& s = State();
  MutexLock lock(&s.mu);
  return s.config;
}

std::shared_ptr<grpc::ServerCredentials> LockstepServerCredentials() {
  ProcessState& s = State();
  MutexLock lock(&s.mu);
  if (!s.server) s.server = ServerCredentialsFor(s.config);
  return s.server;
}

std::shared_ptr<grpc::ChannelCredentials> LockstepChannelCredentials() {
  ProcessState& s = State();
  MutexLock lock(&s.mu);
  if (!s.channel) s.channel = ChannelCredentialsFor(s.config);
  return s.channel;
}

bool IsLoopbackHost(const std::string& host) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost" || h == "::1") return true;
  in_addr v4;
  return inet_pton(AF_INET, h.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

Status CheckPlaintextAllowed(const TlsConfig& config, const std::string& address,
                             const std::string& what, bool forced,
                             const std::string& force_flag) {
  if (config.enabled() || forced || IsLoopbackHost(HostOfAddress(address))) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " ", address,
      " is not a loopback address and TLS is off: tokens would cross the network in plaintext. "
      "Give --tls-ca, --tls-cert and --tls-key (make them with `lockstep certs`), or ",
      force_flag, " to accept plaintext"));
}

std::string ExplainTlsFailure(const std::string& address, const TlsConfig& config,
                              Duration timeout) {
  const std::string host = HostOfAddress(address);
  SigpipeGuard no_sigpipe;
  UniqueFd fd(ConnectTcp(host, PortOfAddress(address), timeout));
  if (!fd.valid()) return "";
  SslCtx ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return "";
  const bool tls = config.enabled();
  if (tls) {
    if (!LoadMaterial(ctx.get(), config)) return "";
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  }
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  Ssl ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), fd.get());
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  if (IsIpLiteral(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  }
  ERR_clear_error();
  const bool handshake_done = SSL_connect(ssl.get()) == 1;
  // TLS 1.3 judges the client's certificate after the client finished: a
  // server that refuses it hangs up (gRPC sends no alert). Send HTTP/2's
  // preface so a server that accepted answers with its SETTINGS.
  bool hung_up = false;
  if (handshake_done) {
    static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
    char buf[64];
    const int wrote = SSL_write(ssl.get(), kPreface, sizeof(kPreface) - 1);
    const int read = wrote > 0 ? SSL_read(ssl.get(), buf, sizeof(buf)) : -1;
    const bool silent = read < 0 && SSL_get_error(ssl.get(), read) == SSL_ERROR_SYSCALL &&
                        ERR_peek_error() == 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    hung_up = read <= 0 && !silent;
  }
  const unsigned long err = ERR_peek_last_error();
  const std::string reason = err != 0 && ERR_reason_error_string(err) != nullptr
                                 ? ERR_reason_error_string(err)
                                 : "the server closed the connection";
  ERR_clear_error();
  if (!tls) {
    // A server that finished a handshake or sent an alert speaks TLS.
    if (handshake_done || absl::StrContains(reason, "alert")) {
      return absl::StrCat(address, " speaks TLS and this side has no TLS settings: give "
                                   "--tls-ca, --tls-cert and --tls-key (or LOCKSTEP_TLS_CA, "
                                   "LOCKSTEP_TLS_CERT, LOCKSTEP_TLS_KEY)");
    }
    return "";  // a plaintext server: not a TLS problem
  }
  const std::string prefix = absl::StrCat("TLS handshake with ", address, " failed: ");
  if (!handshake_done) {
    const long verify = SSL_get_verify_result(ssl.get());
    if (verify != X509_V_OK) {
      return absl::StrCat(prefix, "the server's certificate did not verify: ",
                          X509_verify_cert_error_string(verify), VerifyHint(verify));
    }
    return prefix + Meaning(reason, config.has_identity());
  }
  if (!hung_up) return "";
  // The server took our half of the handshake and hung up: it refused our
  // certificate. Say why, as far as this side can tell.
  if (!config.has_identity()) return prefix + Meaning("certificate required", false);
  const Status own = CheckTlsConfig(config, /*need_identity=*/true);
  if (!own.ok()) {
    return absl::StrCat(prefix, "the server refused this side's certificate: ", own.message());
  }
  return absl::StrCat(prefix, "the server refused this side's certificate after the handshake (",
                      reason, "; was it issued by the server's CA?)");
}

Status WithTlsReason(Status status, const std::string& address) {
  if (status.code() != absl::StatusCode::kUnavailable) return status;
  const std::string why = ExplainTlsFailure(address, ProcessTls());
  if (why.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "; ", why));
}

}  // namespace rendezvous
}  // namespace lockstep
