#include "daemon/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace daemon {
namespace {

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Sends `request` (no half-close) and reads until the server closes.
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server answered and closed early (oversized)
    sent += n;
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
  ::close(fd);
  return response;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void Start(HttpServerOptions options) {
    server_.reset();
    auto started = HttpServer::Start(
        "127.0.0.1:0",
        [](const std::string& path) {
          if (path != "/metrics") return HttpResponse{404, "text/plain", "not found\n"};
          return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", "up 1\n"};
        },
        "metrics", options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(*started);
    ASSERT_GT(server_->port(), 0);
  }
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, ServesMetricsWithLengthAndClose) {
  const std::string r = Exchange(server_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200 OK\r\n")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_TRUE(absl::StrContains(r, "Content-Length: 5\r\n"));
  EXPECT_TRUE(absl::StrContains(r, "Connection: close\r\n"));
  EXPECT_TRUE(absl::EndsWith(r, "\r\n\r\nup 1\n")) << r;
}

TEST_F(HttpServerTest, QueryStringIsIgnoredAndHeadHasNoBody) {
  EXPECT_TRUE(absl::EndsWith(Exchange(server_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
                             "up 1\n"));
  const std::string r = Exchange(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 200 OK\r\n")) << r;
  EXPECT_TRUE(absl::EndsWith(r, "Content-Length: 5\r\nConnection: close\r\n\r\n")) << r;
}

TEST_F(HttpServerTest, OtherPathIsNotFound) {
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), "GET / HTTP/1.1\r\n\r\n"),
                               "HTTP/1.1 404 Not Found\r\n"));
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), "GET /metricsx HTTP/1.1\r\n\r\n"),
                               "HTTP/1.1 404 Not Found\r\n"));
}

TEST_F(HttpServerTest, MalformedRequestIsBadRequest) {
  for (const char* bad : {"garbage\r\n\r\n", "GET /metrics\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n",
                          "GET /metrics SPDY/3\r\n\r\n", "\r\n\r\n"}) {
    EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), bad), "HTTP/1.1 400 Bad Request\r\n"))
        << bad;
  }
}

TEST_F(HttpServerTest, OtherMethodIsNotAllowed) {
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), "POST /metrics HTTP/1.1\r\n\r\n"),
                               "HTTP/1.1 405 Method Not Allowed\r\n"));
}

TEST_F(HttpServerTest, OversizedRequestIsRefusedWithoutReadingItAll) {
  const std::string big = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(64 * 1024, 'a');
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), big + "\r\n\r\n"),
                               "HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  // The server still serves the next client.
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
                               "HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, SilentClientGetsRequestTimeoutThenOthersAreServed) {
  Start({kDefaultMaxHttpRequestBytes, std::chrono::milliseconds(200)});
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n"),
                               "HTTP/1.1 408 Request Timeout\r\n"));
  EXPECT_TRUE(absl::StartsWith(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n"),
                               "HTTP/1.1 200 OK\r\n"));
}

TEST_F(HttpServerTest, BusyPortIsRefusedWithAClearError) {
  const std::string address = absl::StrCat("127.0.0.1:", server_->port());
  auto second = HttpServer::Start(address, [](const std::string&) { return HttpResponse{}; },
                                  "metrics");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            absl::StrCat("metrics cannot listen on ", address,
                         ": Address already in use (another process listens there)"));
}

TEST(HttpServerStartTest, AddressWithoutPortIsInvalid) {
  auto s = HttpServer::Start("127.0.0.1", [](const std::string&) { return HttpResponse{}; },
                             "metrics");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HttpServerStartTest, StopIsIdempotentAndPortIsFreedAfterDestruction) {
  auto s = HttpServer::Start("127.0.0.1:0", [](const std::string&) { return HttpResponse{}; },
                             "metrics");
  ASSERT_TRUE(s.ok());
  const int port = (*s)->port();
  (*s)->Stop();
  (*s)->Stop();
  s->reset();
  auto again = HttpServer::Start(absl::StrCat("127.0.0.1:", port),
                                 [](const std::string&) { return HttpResponse{}; }, "metrics");
  EXPECT_TRUE(again.ok()) << again.status();
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
