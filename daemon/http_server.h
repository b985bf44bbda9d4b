// HttpServer: the smallest HTTP/1.1 server that serves lockstepd's
// Prometheus endpoint (GET /metrics). Plain sockets, and OpenSSL for HTTPS.
//
// HTTPS (HttpServerOptions::tls_*): mutual TLS, as lockstepd's gRPC ports:
// the server presents its certificate and requires a client certificate
// that chains to the CA (TLS 1.2 or later); a client without one, with
// another CA's, or speaking plain HTTP is dropped in the handshake, which
// must end within read_timeout, and the refusal is logged with OpenSSL's
// reason. A client presenting tls_refused_cert_file is answered 403. The files are read at each connection, so renewed files serve
// the next scrape.
//
// Protocol: one request per connection (the response says Connection:
// close). The request line and headers must arrive within
// `read_timeout` and fit in `max_request_bytes`; a body is never read.
// Answers: the handler's response for GET and HEAD (HEAD without body);
// 400 for a request that is not HTTP/1.x, 405 for another method, 408 when
// the headers do not arrive in time, 431 when they exceed the size bound.
//
// Threading: one owned thread accepts and serves connections one at a time,
// so a slow client delays the next scrape by at most read_timeout. The
// handler runs on that thread and must be thread-safe with respect to the
// rest of the program. Stop (or the destructor) wakes the thread and joins
// it; it blocks for at most one request in progress.
#ifndef LOCKSTEP_DAEMON_HTTP_SERVER_H_
#define LOCKSTEP_DAEMON_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"

namespace lockstep {
namespace daemon {

// Default: bound on request line + headers. A scraper sends a few hundred.
inline constexpr size_t kDefaultMaxHttpRequestBytes = 8 * 1024;
// Default: time a client has to send its request line and headers.
inline constexpr Duration kDefaultHttpReadTimeout = std::chrono::seconds(5);

struct HttpResponse {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpServerOptions {
  size_t max_request_bytes = kDefaultMaxHttpRequestBytes;
  Duration read_timeout = kDefaultHttpReadTimeout;
  // HTTPS with mutual TLS when all three are set (PEM files): the CA a
  // client's certificate must chain to, this server's certificate and its
  // key. Default: none (HTTP).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // A certificate of the CA that may not read (PEM; empty: none): lockstepd
  // gives its --tls-worker-cert, which every job's workers hold. A client
  // presenting it gets 403 naming why, and the refusal is logged. Read at
  // each connection, as the other files.
  std::string tls_refused_cert_file;
};

class HttpServer {
 public:
  // Called with the request path (query string removed) for GET and HEAD.
  using Handler = std::function<HttpResponse(const std::string& path)>;

  // Binds `address` ("host:port"; port 0 picks one) and starts serving.
  // Unavailable naming `what`, the address and why ("Address already in
  // use (another process listens there)") when it cannot bind;
  // InvalidArgument for an address without a port, or TLS files that do not
  // load (naming the file and OpenSSL's reason).
  static StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                     Handler handler, const std::string& what,
                                                     HttpServerOptions options = {});
  ~HttpServer();

  // The bound port.
  int port() const { return port_; }
  // Stops accepting and joins the thread. Idempotent.
  void Stop();

 private:
  HttpServer(int listen_fd, int wake_fd_read, int wake_fd_write, int port, Handler handler,
             HttpServerOptions options);
  void Serve();
  // Serves one accepted connection; `peer` (numeric host:port) names the
  // client in the log lines.
  void HandleConnection(int fd, const std::string& peer);

  const int listen_fd_;
  const int wake_read_;   // a pipe: Stop writes, poll in Serve wakes
  const int wake_write_;
  const int port_;
  const Handler handler_;
  const HttpServerOptions options_;
  Logger log_{"http"};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

// Reason phrase of the status codes HttpServer sends ("Not Found").
std::string HttpReason(int code);

}  // namespace daemon
}  // namespace lockstep

#endif  // LOCKSTEP_DAEMON_HTTP_SERVER_H_
