#include "daemon/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/certs.h"

namespace lockstep {
namespace daemon {
namespace {

using certs::OpenSslErrors;
using SslCtx = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;

// A server context from the PEM files in `o`, read now; InvalidArgument
// naming the file that does not load.
StatusOr<SslCtx> ServerContext(const HttpServerOptions& o) {
  SslCtx ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (!ctx) return absl::InternalError("SSL_CTX_new: " + OpenSslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.tls_cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate ", o.tls_cert_file, ": ", OpenSslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), o.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("key ", o.tls_key_file, ": ", OpenSslErrors()));
  }
  STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.tls_ca_file.c_str());
  if (names == nullptr || SSL_CTX_load_verify_locations(ctx.get(), o.tls_ca_file.c_str(),
                                                        nullptr) != 1) {
    if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
    return absl::InvalidArgumentError(absl::StrCat("CA ", o.tls_ca_file, ": ", OpenSslErrors()));
  }
  SSL_CTX_set_client_CA_list(ctx.get(), names);  // takes `names`
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

// One accepted connection, plain or TLS. Every wait is bounded by a
// deadline. Writes are best effort: a client gone mid-response ends it
// (plain writes use MSG_NOSIGNAL; OpenSSL's socket BIO writes with write(2),
// so Serve() blocks SIGPIPE on its thread).
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The server side of a TLS handshake over this connection, by `deadline`.
  // The reason, with OpenSSL's errors, when it fails.
  Status AcceptTls(SSL_CTX* ctx, MonoTime deadline) {
    const int flags = ::fcntl(fd_, F_GETFL);
    ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) {
      return absl::InternalError("SSL_new: " + OpenSslErrors());
    }
    for (;;) {
      const int rc = SSL_accept(ssl_);
      if (rc == 1) return absl::OkStatus();
      const int err = SSL_get_error(ssl_, rc);
      if (Retryable(err)) {
        if (!WaitFor(err, deadline)) {
          return absl::DeadlineExceededError("the handshake did not end in time");
        }
        continue;
      }
      std::string why = err == SSL_ERROR_SYSCALL ? "the client closed the connection"
                                                 : OpenSslErrors();
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        why = absl::StrCat("the client's certificate did not verify: ",
                           X509_verify_cert_error_string(verify));
      }
      SSL_free(ssl_);  // nothing to shut down: no close_notify after a failed handshake
      ssl_ = nullptr;
      ERR_clear_error();
      return absl::UnauthenticatedError(why);
    }
  }

  // Whether the client's certificate (after AcceptTls) is the one in
  // `pem_file`. A file that does not load matches nothing, and says so in
  // `*why`.
  bool PeerCertificateIs(const std::string& pem_file, std::string* why) {
    if (ssl_ == nullptr) return false;
    std::unique_ptr<X509, decltype(&X509_free)> peer(SSL_get1_peer_certificate(ssl_), X509_free);
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(pem_file.c_str(), "r"), BIO_free);
    std::unique_ptr<X509, decltype(&X509_free)> refused(
        bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr, X509_free);
    if (!refused) {
      *why = absl::StrCat("certificate ", pem_file, " does not load: ", OpenSslErrors());
      ERR_clear_error();
      return false;
    }
    return peer != nullptr && X509_cmp(peer.get(), refused.get()) == 0;
  }

  // Reads up to `n` bytes: how many, 0 when the client closed or failed,
  // -1 at the deadline.
  ssize_t Read(char* buf, size_t n, MonoTime deadline) {
    for (;;) {
      if (ssl_ == nullptr) {
        if (!Wait(POLLIN, deadline)) return -1;
        const ssize_t got = ::recv(fd_, buf, n, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        return got < 0 ? 0 : got;
      }
      const int got = SSL_read(ssl_, buf, static_cast<int>(n));
      if (got > 0) return got;
      const int err = SSL_get_error(ssl_, got);
      if (!Retryable(err)) {
        ERR_clear_error();
        return 0;
      }
      if (!WaitFor(err, deadline)) return -1;
    }
  }

  void WriteAll(const std::string& data, MonoTime deadline) {
    size_t sent = 0;
    while (sent < data.size()) {
      if (ssl_ == nullptr) {
        const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        sent += static_cast<size_t>(n);
        continue;
      }
      const int n = SSL_write(ssl_, data.data() + sent, static_cast<int>(data.size() - sent));
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      const int err = SSL_get_error(ssl_, n);
      if (!Retryable(err) || !WaitFor(err, deadline)) {
        ERR_clear_error();
        return;
      }
    }
  }

  // Ends the answer: close_notify (TLS) and FIN. With `drain`, the rest of
  // the client's input is read and dropped first (at most 1 MiB or 200 ms):
  // closing a socket with unread input sends a RST, which can destroy the
  // answer in flight.
  void Finish(bool drain) {
    if (ssl_ != nullptr) {
      (void)SSL_shutdown(ssl_);  // sends close_notify; the client's is not awaited
      ERR_clear_error();
    }
    ::shutdown(fd_, SHUT_WR);
    if (!drain) return;
    char buf[4096];
    size_t dropped = 0;
    while (dropped < (1u << 20) && Wait(POLLIN, std::chrono::steady_clock::now() +
                                                    std::chrono::milliseconds(200))) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) break;
      dropped += static_cast<size_t>(n);
    }
  }

 private:
  // Whether an SSL call that failed with `err` (SSL_get_error) only waits
  // for the socket (non-blocking).
  static bool Retryable(int err) {
    return err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE;
  }
  // Waits until the socket is ready for what a Retryable `err` asks for.
  bool WaitFor(int err, MonoTime deadline) {
    return Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
  }
  // Waits for `events` until `deadline`: false when it passed first.
  bool Wait(short events, MonoTime deadline) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, events, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
    }
  }

  const int fd_;
  SSL* ssl_ = nullptr;
};

std::string Serialize(const HttpResponse& r, bool with_body) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.code, " ", HttpReason(r.code),
                                 "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (with_body) out += r.body;
  return out;
}

HttpResponse Error(int code) { return {code, "text/plain; charset=utf-8", HttpReason(code) + "\n"}; }

}  // namespace

std::string HttpReason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    default: return "Unknown";
  }
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                        Handler handler, const std::string& what,
                                                        HttpServerOptions options) {
  const std::string host = HostOfAddress(address);
  const std::string port = PortOfAddress(address);
  if (port.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", address, "' has no port (want host:port)"));
  }
  if (!options.tls_ca_file.empty()) {
    auto ctx = ServerContext(options);
    if (!ctx.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", ctx.status().message()));
    }
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(),
                                port.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::UnavailableError(absl::StrCat(what, " cannot listen on ", address,
                                               ": cannot resolve '", host, "': ",
                                               gai_strerror(gai)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // As the gRPC listener: a port in TIME_WAIT may be reused, one another
    // socket listens on may not (no SO_REUSEPORT).
    int on = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      why = std::strerror(errno);
      if (errno == EADDRINUSE) why += " (another process listens there)";
      if (errno == EADDRNOTAVAIL) why += " (not an address of this host)";
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(what, " cannot listen on ", address, ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = NumericPort(bound);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(what, ": pipe: ", std::strerror(errno)));
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(fd, wake[0], wake[1], bound_port, std::move(handler), options));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_fd_read, int wake_fd_write, int port,
                       Handler handler, HttpServerOptions options)
    : listen_fd_(listen_fd),
      wake_read_(wake_fd_read),
      wake_write_(wake_fd_write),
      port_(port),
      handler_(std::move(handler)),
      options_(options) {}

HttpServer::~HttpServer() {
  Stop();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void HttpServer::Stop() {
  if (stopped_.exchange(true)) return;
  (void)!::write(wake_write_, "x", 1);
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Serve() {
  // A write to a client that hung up must fail with EPIPE, not kill the
  // process: OpenSSL writes without MSG_NOSIGNAL (a TLS 1.3 server sends its
  // session tickets right after the handshake, to a client that may already
  // be gone). SIGPIPE is blocked on this thread for its whole life, so one
  // raised by its writes stays pending here and is never delivered.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  while (!stopped_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log_.Error("poll on the listening socket failed: {}; serving stops", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    const int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up (ECONNABORTED) or EINTR
    HandleConnection(fd, NumericAddress(peer));
    ::close(fd);
  }
}

// With TLS, the handshake first; then reads until the blank line that
// ends the headers, within the size bound and the read deadline, and
// answers once.
void HttpServer::HandleConnection(int fd, const std::string& peer) {
  const MonoTime deadline = std::chrono::steady_clock::now() + options_.read_timeout;
  Connection conn(fd);
  if (!options_.tls_ca_file.empty()) {
    auto ctx = ServerContext(options_);
    Status s = ctx.ok() ? conn.AcceptTls(ctx->get(), deadline) : ctx.status();
    if (!s.ok()) {
      log_.Info("refused a TLS connection from {}: {}", peer, std::string(s.message()));
      return;
    }
  }
  auto reject = [&](int code) {
    conn.WriteAll(Serialize(Error(code), true),
                  std::chrono::steady_clock::now() + options_.read_timeout);
    conn.Finish(/*drain=*/true);
  };
  if (!options_.tls_ca_file.empty() && !options_.tls_refused_cert_file.empty()) {
    std::string why;
    const bool refused = conn.PeerCertificateIs(options_.tls_refused_cert_file, &why);
    if (!why.empty()) log_.Warn("{}", why);
    if (refused) {
      log_.Info("refused a request from {}: it presented {} (the workers' certificate, which "
                "every job holds)", peer, options_.tls_refused_cert_file);
      HttpResponse forbidden = Error(403);
      forbidden.body = absl::StrCat(
          "Forbidden: this is the workers' certificate (", options_.tls_refused_cert_file,
          "), which every job holds; scrape with another certificate of the cluster CA (lockstep "
          "certs writes client.pem)\n");
      conn.WriteAll(Serialize(forbidden, true),
                    std::chrono::steady_clock::now() + options_.read_timeout);
      conn.Finish(/*drain=*/true);
      return;
    }
  }
  std::string request;
  char buf[2048];
  size_t header_end = std::string::npos;
  while (header_end == std::string::npos) {
    if (request.size() > options_.max_request_bytes) {
      reject(431);
      return;
    }
    const ssize_t n = conn.Read(buf, sizeof(buf), deadline);
    if (n < 0) {
      reject(408);
      return;
    }
    if (stopped_.load()) return;
    if (n == 0) return;  // closed before a full request: nobody to answer
    request.append(buf, static_cast<size_t>(n));
    header_end = request.find("\r\n\r\n");
    if (header_end == std::string::npos) header_end = request.find("\n\n");  // lenient
  }
  if (header_end > options_.max_request_bytes) {
    reject(431);
    return;
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") || parts[1].empty() ||
      parts[1][0] != '/') {
    reject(400);
    return;
  }
  const bool head = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head) {
    reject(405);
    return;
  }
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  conn.WriteAll(Serialize(handler_(path), !head),
                std::chrono::steady_clock::now() + options_.read_timeout);
  conn.Finish(/*drain=*/false);
}

}  // namespace daemon
}  // namespace lockstep
