// Transport security of every Lockstep gRPC server and channel: mutual TLS
// from the cluster CA (common/certs.h), or plaintext.
//
// Servers (rendezvous::StartGrpcServer) present their certificate and
// require a client certificate signed by the CA; clients
// (CreateLockstepChannel in grpc_limits.h, the store client) check the
// server's certificate against the CA and the name they dialled (DNS name
// or IP in its subjectAltName) and present their own certificate.
// Certificates come from files, re-read by gRPC every refresh_interval so a
// renewed certificate is used without a restart (new connections only; a
// connection keeps the certificates it was made with), or from PEM held in
// memory (workers get theirs from the agent in the environment: see
// common/worker_env.h, kTlsCaPem).
//
// One process-wide setting, set once by each composition root (lockstepd,
// lockstep) before it opens a channel or a server, or taken from a worker's
// environment (ProcessTls):
// this is the exception to "no global config", because a transport setting
// passed by hand to every factory is one forgotten argument away from a
// plaintext channel that carries a token. Tests may pass a TlsConfig
// explicitly (ServerCredentialsFor, ChannelCredentialsFor).
//
// Plaintext is for loopback: CheckPlaintextAllowed is the one rule the
// daemon and the CLI apply before they listen or send a token without TLS.
//
// Thread safety: all functions are safe to call from any thread.
#ifndef LOCKSTEP_RENDEZVOUS_TLS_H_
#define LOCKSTEP_RENDEZVOUS_TLS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace lockstep {
namespace rendezvous {

// How often gRPC re-reads certificate files. Default of TlsConfig.
inline constexpr std::chrono::seconds kDefaultTlsRefreshInterval{10};

struct TlsConfig {
  // Files (PEM), watched for changes. Either these or the *_pem fields.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // PEM contents, never reloaded (a worker's, from its environment).
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // Whole seconds, at least 1. Default: kDefaultTlsRefreshInterval.
  Duration refresh_interval = kDefaultTlsRefreshInterval;

  // TLS is on: a CA is given.
  bool enabled() const { return !ca_file.empty() || !ca_pem.empty(); }
  // This side presents a certificate.
  bool has_identity() const { return !cert_file.empty() || !cert_pem.empty(); }
};

// Checks `config` before use: a CA is given whenever a certificate or key
// is, certificate and key come together (both are required when
// `need_identity`: a server always presents one), every file is readable
// and common/certs.h CheckTlsMaterial passes (the key is the certificate's,
// it is valid now and chains to the CA). OK for a config without TLS.
// InvalidArgument naming the flag (`flag_prefix` + "ca", e.g. "--tls-ca")
// and the file.
Status CheckTlsConfig(const TlsConfig& config, bool need_identity,
                      const std::string& flag_prefix = "--tls-");

// The text of the PEM file `path`; InvalidArgument "<flag> <path>: cannot
// read: <errno text>" when it cannot be read, "<flag> <path>: the file is
// empty" when it holds nothing (every caller wants a PEM).
StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag);

// Credentials for `config`: TLS as described above, or insecure when
// !config.enabled(). REQUIRES: CheckTlsConfig passed.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsConfig& config);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsConfig& config);

// The process-wide setting. Default: the worker contract's
// LOCKSTEP_TLS_*_PEM (common/worker_env.h) when set, so every client in a
// worker uses what its agent gave it; else no TLS. REQUIRES: CheckTlsConfig
// passed. Servers and channels opened before a call keep what they had.
void SetProcessTls(const TlsConfig& config);
TlsConfig ProcessTls();
// Credentials for ProcessTls(), made once per SetProcessTls and shared.
std::shared_ptr<grpc::ServerCredentials> LockstepServerCredentials();
std::shared_ptr<grpc::ChannelCredentials> LockstepChannelCredentials();

// Whether `host` is a loopback name: "localhost", 127.0.0.0/8, ::1.
bool IsLoopbackHost(const std::string& host);

// The plaintext rule: OK when TLS is on, when `address`'s host is loopback,
// or when `forced` (the caller logs a warning). Otherwise
// FailedPrecondition saying that `what` ("listen address", "coordinator")
// `address` is not loopback and how to turn TLS on or force plaintext
// (`force_flag`).
Status CheckPlaintextAllowed(const TlsConfig& config, const std::string& address,
                             const std::string& what, bool forced,
                             const std::string& force_flag = "--insecure-plaintext");

// How long ExplainTlsFailure's connect, and each of its reads and writes,
// may take.
inline constexpr std::chrono::seconds kTlsDiagnosisTimeout{3};

// Why a connection to `address` with `config` fails at the TLS layer, found
// by a handshake of our own (OpenSSL; connect, and each read and write, at
// most `timeout`): e.g. "TLS
// handshake with 10.0.0.1:7070 failed: the server's certificate did not
// verify: unable to get local issuer certificate (is --tls-ca the cluster's
// CA?)", or that the server does (or does not) speak TLS when this side
// does not (does). Empty when the handshake succeeds or TCP cannot
// connect (the problem is not TLS). For error messages after gRPC said
// UNAVAILABLE, which does not say why.
std::string ExplainTlsFailure(const std::string& address, const TlsConfig& config,
                              Duration timeout = kTlsDiagnosisTimeout);

// `status` of a call to `address`, with ExplainTlsFailure's reason (under
// the process's TLS) appended when it is UNAVAILABLE and the cause is TLS.
Status WithTlsReason(Status status, const std::string& address);

}  // namespace rendezvous
}  // namespace lockstep

#endif  // LOCKSTEP_RENDEZVOUS_TLS_H_
