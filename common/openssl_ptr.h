// unique_ptr owners for OpenSSL objects, shared by `lockstep certs`
// (common/certs.cc) and the TLS diagnosis (rendezvous/tls.cc).
#ifndef LOCKSTEP_COMMON_OPENSSL_PTR_H_
#define LOCKSTEP_COMMON_OPENSSL_PTR_H_

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

namespace lockstep {
namespace openssl {

// Frees with F, OpenSSL's own destructor for T.
template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};

using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Pkey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using X509Ext = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;
using X509StorePtr = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using X509StoreCtx = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;
using Bignum = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;

}  // namespace openssl
}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_OPENSSL_PTR_H_
