// A small certificate authority for one Lockstep cluster, and the checks a
// process runs on its TLS material before it serves or dials (OpenSSL's C
// API, no `openssl` binary).
//
//   lockstep certs --out DIR --hosts node1,10.0.0.2   (client/lockstep_main.cc)
//
// writes, through WriteClusterCerts:
//   ca.pem, ca.key          the cluster CA (EC P-256, CA:TRUE); ca.key signs, keep it off the nodes
//   HOST.pem, HOST.key      one per host: serverAuth + clientAuth, subjectAltName HOST
//                           (DNS name or IP address); lockstepd's --tls-cert/--tls-key
//   client.pem, client.key  clientAuth only: the CLI's --tls-cert/--tls-key
//   worker.pem, worker.key  clientAuth only: what lockstepd hands its workers
//                           (--tls-worker-cert/--tls-worker-key), so a job's code holds
//                           a key that cannot serve as a node (CheckClientOnly)
// Keys are written 0600, certificates 0644, each through a temporary file
// and a rename, so a daemon watching the files never reads half of one.
// With ca.pem and ca.key already in DIR the CA is reused: running the
// command again adds hosts or renews their certificates under the same CA.
//
// Thread safety: pure functions of their arguments (and of the files they
// read or write).
#ifndef LOCKSTEP_COMMON_CERTS_H_
#define LOCKSTEP_COMMON_CERTS_H_

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace lockstep {
namespace certs {

using SystemTime = std::chrono::system_clock::time_point;

// Certificates made without --days last this long.
inline constexpr int kDefaultCertDays = 365;
// 100 years: well short of 2262, past which an expiry overflows
// system_clock (3,000,000 days wrapped to 2056 before this limit).
inline constexpr int kMaxCertDays = 36500;

// A private key and its certificate, both PEM.
struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

struct CertOptions {
  std::string common_name;
  // Names the certificate is valid for, into subjectAltName: DNS names or
  // IP literals ("10.0.0.2", "::1"; brackets allowed). Default: none.
  std::vector<std::string> hosts;
  bool server_auth = true;  // extendedKeyUsage serverAuth
  bool client_auth = true;  // extendedKeyUsage clientAuth
  SystemTime not_before;
  SystemTime not_after;
};

// OpenSSL's queued errors (this thread's) as one line, "; "-separated;
// clears the queue. "no OpenSSL error queued" when there is none.
std::string OpenSslErrors();

// A self-signed CA valid from `not_before` to `not_after`.
// Internal if OpenSSL fails (the message carries its error).
StatusOr<KeyAndCert> MakeCa(const std::string& common_name, SystemTime not_before,
                            SystemTime not_after);

// A leaf certificate with a new key, signed by `ca`. InvalidArgument for a
// CA that does not parse, an empty host, or not_after before not_before.
StatusOr<KeyAndCert> IssueCert(const KeyAndCert& ca, const CertOptions& options);

// Writes the files described above for `hosts` into `dir` (created 0755 if
// missing, with its missing parents, as `mkdir -p`), certificates valid for
// `days` from now. Returns the paths written, CA first (an existing CA is
// reused, not written, and not among them). InvalidArgument for no hosts,
// days outside 1..kMaxCertDays, or a host that is neither a DNS name nor an
// IP address (or is "ca", "client" or "worker");
// PermissionDenied (no access) / FailedPrecondition (say, a file where a
// directory should be) naming the directory that could not be made;
// PermissionDenied / Unavailable naming the file that could not be written.
StatusOr<std::vector<std::string>> WriteClusterCerts(const std::string& dir,
                                                     const std::vector<std::string>& hosts,
                                                     int days);

// Checks one process's TLS material before use: each PEM parses, `key_pem`
// is the key of `cert_pem`, the certificate is valid at `now` and chains to
// `ca_pem`. `cert_pem`/`key_pem` may both be empty (a client with no
// identity). `what` names the source in messages ("--tls-cert /etc/x.pem").
// InvalidArgument saying which of these failed, e.g. "certificate ... expired
// at 2024-01-01 00:00:00 UTC".
Status CheckTlsMaterial(const std::string& ca_pem, const std::string& cert_pem,
                        const std::string& key_pem, SystemTime now,
                        const std::string& ca_what, const std::string& cert_what,
                        const std::string& key_what);

// InvalidArgument unless `cert_pem` can only serve as a client's
// certificate: its extendedKeyUsage has clientAuth and neither serverAuth
// nor anyExtendedKeyUsage (a certificate without the extension is good for
// any purpose, a server's included). `what` names it in messages.
// lockstepd's --tls-worker-cert: a worker's code must not be able to pass
// for a node to the CLI or to agents (they would send it their tokens).
Status CheckClientOnly(const std::string& cert_pem, const std::string& what);

}  // namespace certs
}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CERTS_H_
