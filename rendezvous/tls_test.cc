// Mutual TLS end to end on loopback: a real StoreServer (StartGrpcServer)
// and the real store client, with certificates from common/certs.h.
#include "rendezvous/tls.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/certs.h"
#include "rendezvous/grpc_limits.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"

namespace lockstep {
namespace rendezvous {
namespace {

using certs::KeyAndCert;
using std::chrono::hours;

KeyAndCert Ca(const std::string& name) {
  const auto now = std::chrono::system_clock::now();
  auto ca = certs::MakeCa(name, now - hours(1), now + hours(24));
  EXPECT_TRUE(ca.ok()) << ca.status();
  return *ca;
}

KeyAndCert Leaf(const KeyAndCert& ca, const std::string& name,
                std::chrono::system_clock::time_point not_after) {
  certs::CertOptions options;
  options.common_name = name;
  options.hosts = {"127.0.0.1", "localhost"};
  options.not_before = not_after - hours(48);
  options.not_after = not_after;
  auto leaf = certs::IssueCert(ca, options);
  EXPECT_TRUE(leaf.ok()) << leaf.status();
  return *leaf;
}

void WriteFile(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::binary) << data;
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/tls_test_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ::mkdir(dir_.c_str(), 0700);
    ca_ = Ca("test CA");
    const auto later = std::chrono::system_clock::now() + hours(24);
    server_ = Leaf(ca_, "server", later);
    client_ = Leaf(ca_, "client", later);
  }
  void TearDown() override { SetProcessTls(TlsConfig{}); }

  // Files DIR/NAME.{ca,pem,key} and a config naming them.
  TlsConfig Files(const std::string& name, const KeyAndCert& ca, const KeyAndCert* leaf) {
    TlsConfig c;
    c.ca_file = absl::StrCat(dir_, "/", name, ".ca");
    WriteFile(c.ca_file, ca.cert_pem);
    if (leaf != nullptr) {
      c.cert_file = absl::StrCat(dir_, "/", name, ".pem");
      c.key_file = absl::StrCat(dir_, "/", name, ".key");
      WriteFile(c.key_file, leaf->key_pem);
      EXPECT_EQ(::chmod(c.key_file.c_str(), 0600), 0);
      WriteFile(c.cert_file, leaf->cert_pem);
    }
    c.refresh_interval = std::chrono::seconds(1);
    return c;
  }

  // A store server with `config` on 127.0.0.1, port 0.
  std::unique_ptr<StoreServer> Serve(const TlsConfig& config) {
    SetProcessTls(config);
    auto server = StoreServer::Start("127.0.0.1:0");
    EXPECT_TRUE(server.ok()) << server.status();
    SetProcessTls(TlsConfig{});
    address_ = absl::StrCat("127.0.0.1:", (*server)->port());
    return std::move(*server);
  }

  // One Set through a client with `config`; its status.
  Status SetAs(const TlsConfig& config) {
    SetProcessTls(config);
    StoreClientOptions options;
    options.connect_timeout = std::chrono::seconds(3);
    auto store = ConnectStore(address_, "job/1", options);
    SetProcessTls(TlsConfig{});
    if (!store.ok()) return store.status();
    return (*store)->Set("k", "v");
  }

  std::string dir_;
  std::string address_;
  KeyAndCert ca_, server_, client_;
};

TEST_F(TlsTest, ClientWithTheClusterCaAndItsCertificateIsServed) {
  auto server = Serve(Files("server", ca_, &server_));
  const TlsConfig client = Files("client", ca_, &client_);
  ASSERT_TRUE(CheckTlsConfig(client, /*need_identity=*/true).ok());
  EXPECT_TRUE(SetAs(client).ok()) << SetAs(client);
  EXPECT_EQ(ExplainTlsFailure(address_, client), "");
}

TEST_F(TlsTest, ClientWithTheWrongCaRefusesTheServer) {
  auto server = Serve(Files("server", ca_, &server_));
  const KeyAndCert other = Ca("another cluster's CA");
  const KeyAndCert other_client = Leaf(other, "client", std::chrono::system_clock::now() + hours(24));
  const TlsConfig client = Files("client", other, &other_client);
  Status s = SetAs(client);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  const std::string why = ExplainTlsFailure(address_, client);
  EXPECT_NE(why.find("TLS handshake with " + address_ + " failed"), std::string::npos) << why;
  EXPECT_NE(why.find("server's certificate did not verify"), std::string::npos) << why;
  EXPECT_NE(why.find("is --tls-ca the cluster's CA?"), std::string::npos) << why;
}

TEST_F(TlsTest, ServerRefusesAClientCertificateFromAnotherCa) {
  auto server = Serve(Files("server", ca_, &server_));
  const KeyAndCert other = Ca("another cluster's CA");
  const KeyAndCert stranger = Leaf(other, "client", std::chrono::system_clock::now() + hours(24));
  TlsConfig client;  // trusts the server, presents a stranger's certificate
  client.ca_pem = ca_.cert_pem;
  client.cert_pem = stranger.cert_pem;
  client.key_pem = stranger.key_pem;
  EXPECT_EQ(SetAs(client).code(), absl::StatusCode::kUnavailable);
  const std::string why = ExplainTlsFailure(address_, client);
  EXPECT_NE(why.find("the server refused this side's certificate"), std::string::npos) << why;
  EXPECT_NE(why.find("not issued by"), std::string::npos) << why;
}

TEST_F(TlsTest, ServerRefusesAnExpiredClientCertificate) {
  auto server = Serve(Files("server", ca_, &server_));
  const KeyAndCert expired = Leaf(ca_, "client", std::chrono::system_clock::now() - hours(1));
  const TlsConfig client = Files("client", ca_, &expired);
  // Checked before use, with a message that says so ...
  Status checked = CheckTlsConfig(client, /*need_identity=*/true);
  EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(checked.message().find("certificate has expired"), std::string::npos) << checked;
  // ... and refused by the server when used anyway.
  EXPECT_EQ(SetAs(client).code(), absl::StatusCode::kUnavailable);
  const std::string why = ExplainTlsFailure(address_, client);
  EXPECT_NE(why.find("the server refused this side's certificate"), std::string::npos) << why;
  EXPECT_NE(why.find("certificate has expired"), std::string::npos) << why;
}

TEST_F(TlsTest, ClientRefusesAnExpiredServerCertificate) {
  const KeyAndCert expired = Leaf(ca_, "server", std::chrono::system_clock::now() - hours(1));
  auto server = Serve(Files("server", ca_, &expired));
  const TlsConfig client = Files("client", ca_, &client_);
  EXPECT_EQ(SetAs(client).code(), absl::StatusCode::kUnavailable);
  const std::string why = ExplainTlsFailure(address_, client);
  EXPECT_NE(why.find("certificate has expired"), std::string::npos) << why;
}

TEST_F(TlsTest, ServerRefusesAClientWithoutACertificate) {
  auto server = Serve(Files("server", ca_, &server_));
  const TlsConfig client = Files("client", ca_, nullptr);
  EXPECT_TRUE(CheckTlsConfig(client, /*need_identity=*/false).ok());
  EXPECT_FALSE(CheckTlsConfig(client, /*need_identity=*/true).ok());
  EXPECT_EQ(SetAs(client).code(), absl::StatusCode::kUnavailable);
  const std::string why = ExplainTlsFailure(address_, client);
  EXPECT_NE(why.find("requires a client certificate"), std::string::npos) << why;
}

TEST_F(TlsTest, PlaintextClientAndTlsServerDoNotTalkAndTheErrorSaysWhy) {
  auto server = Serve(Files("server", ca_, &server_));
  EXPECT_EQ(SetAs(TlsConfig{}).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(ExplainTlsFailure(address_, TlsConfig{}).find("speaks TLS"), std::string::npos);
}

TEST_F(TlsTest, TlsClientAndPlaintextServerDoNotTalkAndTheErrorSaysWhy) {
  auto server = Serve(TlsConfig{});
  const TlsConfig client = Files("client", ca_, &client_);
  EXPECT_EQ(SetAs(client).code(), absl::StatusCode::kUnavailable);
  const std::string why = ExplainTlsFailure(address_, client);
  EXPECT_NE(why.find("does not speak TLS"), std::string::npos) << why;
}

TEST_F(TlsTest, ReplacedCertificateFilesArePickedUpWithoutRestart) {
  // The server starts with a certificate its clients' CA does not know;
  // then its files are replaced by ones from that CA.
  const KeyAndCert old_ca = Ca("old CA");
  const KeyAndCert old_server =
      Leaf(old_ca, "server", std::chrono::system_clock::now() + hours(24));
  TlsConfig server_config = Files("server", old_ca, &old_server);
  auto server = Serve(server_config);
  const TlsConfig client = Files("client", ca_, &client_);
  ASSERT_EQ(SetAs(client).code(), absl::StatusCode::kUnavailable);

  WriteFile(server_config.key_file, server_.key_pem);
  WriteFile(server_config.cert_file, server_.cert_pem);
  WriteFile(server_config.ca_file, ca_.cert_pem);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  Status s;
  while (std::chrono::steady_clock::now() < deadline) {
    s = SetAs(client);
    if (s.ok()) break;
  }
  EXPECT_TRUE(s.ok()) << "the server never used its new certificate: " << s;
}

// A key file every user of the host can read is refused, as ssh refuses
// one: a job of another uid could pass for this node with it.
TEST_F(TlsTest, AKeyFileOthersCanReadIsRefusedNamingItsMode) {
  TlsConfig c = Files("open", ca_, &server_);
  ASSERT_EQ(::chmod(c.key_file.c_str(), 0644), 0);
  Status s = CheckTlsConfig(c, /*need_identity=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("--tls-key " + c.key_file + " is mode 0644"), std::string::npos) << s;
  ASSERT_EQ(::chmod(c.key_file.c_str(), 0640), 0);  // a group's, as a Kubernetes fsGroup makes it
  EXPECT_TRUE(CheckTlsConfig(c, /*need_identity=*/true).ok());
}

TEST_F(TlsTest, WorkerStyleInMemoryPemWorks) {
  auto server = Serve(Files("server", ca_, &server_));
  TlsConfig client;
  client.ca_pem = ca_.cert_pem;
  client.cert_pem = client_.cert_pem;
  client.key_pem = client_.key_pem;
  ASSERT_TRUE(CheckTlsConfig(client, /*need_identity=*/true).ok());
  EXPECT_TRUE(SetAs(client).ok());
  // CreateLockstepChannel uses the process setting too.
  SetProcessTls(client);
  auto channel = CreateLockstepChannel(address_);
  EXPECT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
}

TEST(TlsConfigTest, IncompleteSettingsAreRefusedNamingTheFlag) {
  TlsConfig only_cert;
  only_cert.cert_file = "/x.pem";
  only_cert.key_file = "/x.key";
  Status s = CheckTlsConfig(only_cert, false);
  EXPECT_NE(s.message().find("need --tls-ca"), std::string::npos) << s;
  TlsConfig no_key;
  no_key.ca_file = "/ca.pem";
  no_key.cert_file = "/x.pem";
  s = CheckTlsConfig(no_key, false);
  EXPECT_NE(s.message().find("go together"), std::string::npos) << s;
  TlsConfig missing;
  missing.ca_file = "/nonexistent/ca.pem";
  s = CheckTlsConfig(missing, false);
  EXPECT_NE(s.message().find("--tls-ca /nonexistent/ca.pem: cannot read"), std::string::npos) << s;
}

TEST(TlsConfigTest, EmptyFileIsRefusedNamingTheFlag) {
  const std::string empty = testing::TempDir() + "/empty.pem";
  { std::ofstream(empty).flush(); }
  auto read = ReadPem(empty, "--tls-worker-cert");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read.status().message(), "--tls-worker-cert " + empty + ": the file is empty");
  TlsConfig config;
  config.ca_file = empty;
  Status s = CheckTlsConfig(config, false);
  EXPECT_NE(s.message().find("--tls-ca " + empty + ": the file is empty"), std::string::npos) << s;
}

TEST(TlsConfigTest, PlaintextOnlyOnLoopbackUnlessForced) {
  TlsConfig none;
  EXPECT_TRUE(CheckPlaintextAllowed(none, "127.0.0.1:7070", "listen address", false).ok());
  EXPECT_TRUE(CheckPlaintextAllowed(none, "localhost:7070", "listen address", false).ok());
  EXPECT_TRUE(CheckPlaintextAllowed(none, "[::1]:7070", "listen address", false).ok());
  Status s = CheckPlaintextAllowed(none, "0.0.0.0:7070", "listen address", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--insecure-plaintext"), std::string::npos) << s;
  EXPECT_TRUE(CheckPlaintextAllowed(none, "10.0.0.1:7070", "listen address", true).ok());
  TlsConfig tls;
  tls.ca_file = "/ca.pem";
  EXPECT_TRUE(CheckPlaintextAllowed(tls, "10.0.0.1:7070", "listen address", false).ok());
}

}  // namespace
}  // namespace rendezvous
}  // namespace lockstep
