#include "daemon/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/certs.h"

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
  HttpServerOptions options;
  options.read_timeout = std::chrono::milliseconds(200);
  Start(options);
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

// HTTPS with mutual TLS, certificates from `lockstep certs`
// (certs::WriteClusterCerts).
struct TlsGetResult {
  std::string response;       // what came back before the server closed
  std::string error;          // OpenSSL's errors when the handshake or the read failed
  std::string server_serial;  // the certificate the server presented, hex
};

// GET /metrics over TLS, checking the server against `ca`; `cert`/`key`
// empty: no client certificate.
TlsGetResult TlsGet(int port, const std::string& ca, const std::string& cert,
                    const std::string& key) {
  TlsGetResult out;
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  EXPECT_EQ(SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!cert.empty()) {
    EXPECT_EQ(SSL_CTX_use_certificate_file(ctx, cert.c_str(), SSL_FILETYPE_PEM), 1);
    EXPECT_EQ(SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM), 1);
  }
  const int fd = Connect(port);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  auto errors = [] {
    std::string e;
    while (unsigned long code = ERR_get_error()) {
      char buf[256];
      ERR_error_string_n(code, buf, sizeof(buf));
      absl::StrAppend(&e, buf, "; ");
    }
    return e.empty() ? std::string("closed") : e;
  };
  if (SSL_connect(ssl) != 1) {
    out.error = errors();
  } else {
    if (X509* peer = SSL_get1_peer_certificate(ssl)) {
      BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(peer), nullptr);
      char* hex = BN_bn2hex(bn);
      out.server_serial = hex;
      OPENSSL_free(hex);
      BN_free(bn);
      X509_free(peer);
    }
    const std::string request = "GET /metrics HTTP/1.1\r\n\r\n";
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0) out.response.append(buf, n);
    if (out.response.empty()) out.error = errors();
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ::close(fd);
  return out;
}

class HttpsTest : public HttpServerTest {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/https_", ::getpid());
    other_ = dir_ + "_other";
    ASSERT_TRUE(certs::WriteClusterCerts(dir_, {"127.0.0.1"}, 2).ok());
    ASSERT_TRUE(certs::WriteClusterCerts(other_, {"127.0.0.1"}, 2).ok());
    StartTls(std::chrono::seconds(5));
  }
  void StartTls(Duration read_timeout) {
    HttpServerOptions options;
    options.read_timeout = read_timeout;
    options.tls_ca_file = dir_ + "/ca.pem";
    options.tls_cert_file = dir_ + "/127.0.0.1.pem";
    options.tls_key_file = dir_ + "/127.0.0.1.key";
    Start(options);
  }
  TlsGetResult Get(const std::string& client) {
    return TlsGet(server_->port(), dir_ + "/ca.pem", client.empty() ? "" : client + ".pem",
                  client.empty() ? "" : client + ".key");
  }
  std::string dir_, other_;
};

TEST_F(HttpsTest, ServesAClientCertificateFromTheCa) {
  for (const char* who : {"client", "worker"}) {
    TlsGetResult r = Get(dir_ + "/" + who);
    EXPECT_TRUE(absl::StartsWith(r.response, "HTTP/1.1 200 OK\r\n")) << who << ": " << r.error;
    EXPECT_TRUE(absl::EndsWith(r.response, "\r\n\r\nup 1\n")) << r.response;
  }
}

// The workers' certificate (lockstepd's --tls-worker-cert) chains to the CA
// like any other, but every job holds it: it gets 403 saying why, and the
// scraper's certificate is served as before.
TEST_F(HttpsTest, RefusesTheWorkersCertificate) {
  HttpServerOptions options;
  options.tls_ca_file = dir_ + "/ca.pem";
  options.tls_cert_file = dir_ + "/127.0.0.1.pem";
  options.tls_key_file = dir_ + "/127.0.0.1.key";
  options.tls_refused_cert_file = dir_ + "/worker.pem";
  Start(options);
  TlsGetResult worker = Get(dir_ + "/worker");
  EXPECT_TRUE(absl::StartsWith(worker.response, "HTTP/1.1 403 Forbidden\r\n")) << worker.error;
  EXPECT_NE(worker.response.find("the workers' certificate"), std::string::npos)
      << worker.response;
  EXPECT_EQ(worker.response.find("up 1"), std::string::npos) << worker.response;
  TlsGetResult client = Get(dir_ + "/client");
  EXPECT_TRUE(absl::StartsWith(client.response, "HTTP/1.1 200 OK\r\n")) << client.error;
  EXPECT_TRUE(absl::EndsWith(client.response, "\r\n\r\nup 1\n")) << client.response;
}

// No client certificate, one from another CA, or plain HTTP: no answer
// (the handshake fails), and the server goes on serving.
TEST_F(HttpsTest, RefusesClientsWithoutACertificateFromTheCa) {
  TlsGetResult none = Get("");
  EXPECT_EQ(none.response, "");
  EXPECT_NE(none.error.find("certificate required"), std::string::npos) << none.error;
  TlsGetResult stranger = Get(other_ + "/client");
  EXPECT_EQ(stranger.response, "");
  EXPECT_NE(stranger.error.find("unknown ca"), std::string::npos) << stranger.error;
  EXPECT_EQ(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n").find("up 1"),
            std::string::npos);
  EXPECT_TRUE(absl::StartsWith(Get(dir_ + "/client").response, "HTTP/1.1 200 OK\r\n"));
}

// A client with a good certificate that hangs up as soon as its side of
// the handshake is done (as curl does when the server's name does not
// match): the server's TLS 1.3 session tickets then go to a closed
// connection. The write fails (EPIPE) and that connection ends; the process
// is not killed by SIGPIPE, and the next client is served.
TEST_F(HttpsTest, ClientHangingUpAfterTheHandshakeDoesNotKillTheProcess) {
  for (int i = 0; i < 20; ++i) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    ASSERT_EQ(SSL_CTX_use_certificate_file(ctx, (dir_ + "/client.pem").c_str(), SSL_FILETYPE_PEM), 1);
    ASSERT_EQ(SSL_CTX_use_PrivateKey_file(ctx, (dir_ + "/client.key").c_str(), SSL_FILETYPE_PEM), 1);
    const int fd = Connect(server_->port());
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    EXPECT_EQ(SSL_connect(ssl), 1);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
  }
  TlsGetResult r = Get(dir_ + "/client");
  EXPECT_TRUE(absl::StartsWith(r.response, "HTTP/1.1 200 OK\r\n")) << r.error;
}

// A client that connects and never starts the handshake holds the server
// for read_timeout at most.
TEST_F(HttpsTest, SilentClientIsDroppedThenOthersAreServed) {
  StartTls(std::chrono::milliseconds(200));
  const int silent = Connect(server_->port());
  EXPECT_TRUE(absl::StartsWith(Get(dir_ + "/client").response, "HTTP/1.1 200 OK\r\n"));
  ::close(silent);
}

// The files are read at each connection: certificates renewed on disk
// serve the next one, without a restart.
TEST_F(HttpsTest, RenewedCertificateServesTheNextConnection) {
  const std::string before = Get(dir_ + "/client").server_serial;
  ASSERT_FALSE(before.empty());
  ASSERT_TRUE(certs::WriteClusterCerts(dir_, {"127.0.0.1"}, 2).ok());
  TlsGetResult after = Get(dir_ + "/client");
  EXPECT_TRUE(absl::StartsWith(after.response, "HTTP/1.1 200 OK\r\n")) << after.error;
  EXPECT_NE(after.server_serial, before);
}

TEST(HttpsStartTest, FilesThatDoNotLoadAreNamed) {
  HttpServerOptions options;
  options.tls_ca_file = "/nonexistent/ca.pem";
  options.tls_cert_file = "/nonexistent/cert.pem";
  options.tls_key_file = "/nonexistent/key.pem";
  auto s = HttpServer::Start("127.0.0.1:0", [](const std::string&) { return HttpResponse{}; },
                             "metrics", options);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.status().message(), "metrics: certificate /nonexistent/cert.pem: "))
      << s.status();
}

}  // namespace
}  // namespace daemon
}  // namespace lockstep
