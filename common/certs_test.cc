#include "common/certs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace lockstep {
namespace certs {
namespace {

using std::chrono::hours;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Mode(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
}

TEST(CertsTest, IssuedCertificateChainsToItsCaAndNotToAnother) {
  const auto now = std::chrono::system_clock::now();
  auto ca = MakeCa("ca", now - hours(1), now + hours(2));
  auto other = MakeCa("other", now - hours(1), now + hours(2));
  ASSERT_TRUE(ca.ok() && other.ok());
  CertOptions options;
  options.common_name = "node";
  options.hosts = {"node1", "10.0.0.2", "[::1]"};
  options.not_before = now - hours(1);
  options.not_after = now + hours(1);
  auto leaf = IssueCert(*ca, options);
  ASSERT_TRUE(leaf.ok()) << leaf.status();
  EXPECT_TRUE(CheckTlsMaterial(ca->cert_pem, leaf->cert_pem, leaf->key_pem, now, "ca", "cert",
                               "key")
                  .ok());
  Status s = CheckTlsMaterial(other->cert_pem, leaf->cert_pem, leaf->key_pem, now, "other-ca",
                              "cert", "key");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not issued by other-ca"), std::string::npos) << s;
  // Not its key.
  s = CheckTlsMaterial(ca->cert_pem, leaf->cert_pem, ca->key_pem, now, "ca", "cert", "key");
  EXPECT_NE(s.message().find("key is not the key of the certificate cert"), std::string::npos)
      << s;
  // Expired two hours later.
  s = CheckTlsMaterial(ca->cert_pem, leaf->cert_pem, leaf->key_pem, now + hours(2), "ca", "cert",
                       "key");
  EXPECT_NE(s.message().find("certificate has expired at"), std::string::npos) << s;
}

TEST(CertsTest, GarbageIsNotACertificate) {
  Status s = CheckTlsMaterial("junk", "", "", std::chrono::system_clock::now(), "--tls-ca x",
                              "", "");
  EXPECT_NE(s.message().find("--tls-ca x is not a PEM certificate"), std::string::npos) << s;
}

TEST(CertsTest, WriteClusterCertsWritesEveryFileAndReusesTheCa) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/certs_", ::getpid());
  auto written = WriteClusterCerts(dir, {"node1", "10.0.0.2"}, 30);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->size(), 10u);
  for (const char* f : {"ca.key", "node1.key", "10.0.0.2.key", "client.key", "worker.key"}) {
    EXPECT_EQ(Mode(dir + "/" + f), 0600) << f;
  }
  EXPECT_EQ(Mode(dir + "/ca.pem"), 0644);
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(CheckTlsMaterial(Read(dir + "/ca.pem"), Read(dir + "/node1.pem"),
                               Read(dir + "/node1.key"), now, "ca", "c", "k")
                  .ok());
  const std::string ca = Read(dir + "/ca.pem");
  auto again = WriteClusterCerts(dir, {"node3"}, 30);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Read(dir + "/ca.pem"), ca) << "a second run must keep the CA";
  // Reused, not written: node3's, the client's and the workers' pairs only.
  EXPECT_EQ(again->size(), 6u);
  for (const std::string& path : *again) EXPECT_EQ(path.find("/ca."), std::string::npos) << path;
  EXPECT_TRUE(CheckTlsMaterial(ca, Read(dir + "/node3.pem"), Read(dir + "/node3.key"), now, "ca",
                               "c", "k")
                  .ok());
  EXPECT_EQ(WriteClusterCerts(dir, {}, 30).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteClusterCerts(dir, {"a/b"}, 30).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteClusterCerts(dir, {"x"}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // Past 36500 days the expiry overflows system_clock (2262).
  EXPECT_EQ(WriteClusterCerts(dir, {"x"}, kMaxCertDays + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* bad : {"bad host", "-lead", "trail-.x", "a..b", ".x", "x/y", "nul\x01"}) {
    EXPECT_EQ(WriteClusterCerts(dir, {bad}, 30).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  for (const char* good : {"node-1.example.org", "under_score", "10.1.2.3", "fe80::1"}) {
    EXPECT_TRUE(WriteClusterCerts(dir, {good}, 30).ok()) << good;
  }
  EXPECT_EQ(WriteClusterCerts(dir, {"worker"}, 30).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a host named worker would overwrite the workers' certificate";
}

// A CA found in --out is reused only if nobody else could have put it there
// or can read its key, and it outlives what it is asked to sign: before,
// a 0777 directory with someone's ca.key at 0644 was "reused (the cluster's
// CA)" and signed node certificates.
TEST(CertsTest, ACaOthersCouldHavePlacedOrReadIsNotReused) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/certs_foreign_", ::getpid());
  ASSERT_TRUE(WriteClusterCerts(dir, {"node1"}, 30).ok());
  const std::string ca = Read(dir + "/ca.pem");

  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  auto got = WriteClusterCerts(dir, {"node2"}, 30);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
  EXPECT_NE(got.status().message().find("mode 0777"), std::string::npos) << got.status();
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);

  ASSERT_EQ(::chmod((dir + "/ca.key").c_str(), 0644), 0);
  got = WriteClusterCerts(dir, {"node2"}, 30);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
  EXPECT_NE(got.status().message().find("ca.key is owned by uid"), std::string::npos) << got.status();
  ASSERT_EQ(::chmod((dir + "/ca.key").c_str(), 0600), 0);

  // The CA lives the asked days plus a year: certificates past it are refused.
  got = WriteClusterCerts(dir, {"node2"}, 30 + 365 + 2);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_NE(got.status().message().find("before the certificates asked for would"), std::string::npos)
      << got.status();
  struct stat st;
  EXPECT_NE(::stat((dir + "/node2.pem").c_str(), &st), 0) << "a refused run wrote a certificate";

  ASSERT_TRUE(WriteClusterCerts(dir, {"node2"}, 30).ok());
  EXPECT_EQ(Read(dir + "/ca.pem"), ca);
}

// `lockstep certs --out /etc/lockstep/tls` on a host with no /etc/lockstep:
// the missing parents are made too; a file in the way is named.
TEST(CertsTest, WriteClusterCertsMakesMissingParentDirectories) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/certs_parents_", ::getpid());
  const std::string dir = base + "/etc/lockstep/tls";
  auto written = WriteClusterCerts(dir, {"node1"}, 1);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(Mode(base + "/etc/lockstep"), 0755);
  EXPECT_EQ(Mode(dir), 0755);
  EXPECT_EQ(Mode(dir + "/node1.key"), 0600);
  std::ofstream(base + "/file") << "not a directory";
  auto blocked = WriteClusterCerts(base + "/file/tls", {"node1"}, 1);
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition) << blocked.status();
  EXPECT_NE(blocked.status().message().find("mkdir " + base + "/file/tls"), std::string::npos)
      << blocked.status();
}

// The workers' certificate is a client's only; a node's, or one with no
// extendedKeyUsage (good for anything), is refused with the reason.
TEST(CertsTest, CheckClientOnlyAcceptsOnlyClientCertificates) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/client_only_", ::getpid());
  ASSERT_TRUE(WriteClusterCerts(dir, {"node1"}, 30).ok());
  const std::string ca = Read(dir + "/ca.pem");
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(CheckTlsMaterial(ca, Read(dir + "/worker.pem"), Read(dir + "/worker.key"), now, "ca",
                               "c", "k")
                  .ok());
  EXPECT_TRUE(CheckClientOnly(Read(dir + "/worker.pem"), "w").ok());
  EXPECT_TRUE(CheckClientOnly(Read(dir + "/client.pem"), "c").ok());
  Status node = CheckClientOnly(Read(dir + "/node1.pem"), "--tls-worker-cert node1.pem");
  EXPECT_EQ(node.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(node.message()),
              ::testing::HasSubstr("--tls-worker-cert node1.pem is good for a server"));

  KeyAndCert authority{Read(dir + "/ca.key"), ca};
  CertOptions any;
  any.common_name = "no usage";
  any.server_auth = false;
  any.client_auth = false;
  any.not_before = now - std::chrono::hours(1);
  any.not_after = now + std::chrono::hours(1);
  auto unrestricted = IssueCert(authority, any);
  ASSERT_TRUE(unrestricted.ok()) << unrestricted.status();
  Status s = CheckClientOnly(unrestricted->cert_pem, "x.pem");
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("x.pem has no extendedKeyUsage"));
  EXPECT_FALSE(CheckClientOnly("garbage", "g").ok());
}

}  // namespace
}  // namespace certs
}  // namespace lockstep
