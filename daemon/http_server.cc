#include "daemon/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/address.h"

namespace lockstep {
namespace daemon {
namespace {

// Sends all of `data` (MSG_NOSIGNAL: a client gone mid-response is not a
// SIGPIPE). Best effort: a failed send ends the connection.
void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string Serialize(const HttpResponse& r, bool with_body) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.code, " ", HttpReason(r.code),
                                 "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (with_body) out += r.body;
  return out;
}

HttpResponse Error(int code) { return {code, "text/plain; charset=utf-8", HttpReason(code) + "\n"}; }

// Answers `code` and closes gracefully: closing a socket with unread input
// sends a RST, which can destroy the answer in flight, so the rest of the
// client's request is read and dropped first (at most 1 MiB or 200 ms).
void Reject(int fd, int code) {
  SendAll(fd, Serialize(Error(code), true));
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  size_t dropped = 0;
  pollfd p{fd, POLLIN, 0};
  while (dropped < (1u << 20) && ::poll(&p, 1, 200) > 0) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

}  // namespace

std::string HttpReason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
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
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
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
  while (!stopped_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log_.Error("poll on the listening socket failed: {}; serving stops", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up (ECONNABORTED) or EINTR
    HandleConnection(fd);
    ::close(fd);
  }
}

// Reads until the blank line that ends the headers, within the size bound
// and the read deadline, then answers once.
void HttpServer::HandleConnection(int fd) {
  const MonoTime deadline = std::chrono::steady_clock::now() + options_.read_timeout;
  std::string request;
  char buf[2048];
  size_t header_end = std::string::npos;
  while (header_end == std::string::npos) {
    if (request.size() > options_.max_request_bytes) {
      Reject(fd, 431);
      return;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      Reject(fd, 408);
      return;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the deadline check above answers 408
    if (stopped_.load()) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed before a full request: nobody to answer
    request.append(buf, static_cast<size_t>(n));
    header_end = request.find("\r\n\r\n");
    if (header_end == std::string::npos) header_end = request.find("\n\n");  // lenient
  }
  if (header_end > options_.max_request_bytes) {
    Reject(fd, 431);
    return;
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") || parts[1].empty() ||
      parts[1][0] != '/') {
    Reject(fd, 400);
    return;
  }
  const bool head = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head) {
    Reject(fd, 405);
    return;
  }
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  SendAll(fd, Serialize(handler_(path), !head));
}

}  // namespace daemon
}  // namespace lockstep
