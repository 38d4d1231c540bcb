/* ssl_dl.h: the three OpenSSL calls lib/conn/http.c makes on libcurl's own
 * TLS context, loaded the first time they are needed (dl.h says why).
 *
 * What for: to know whether the server asked for a client certificate.
 * With TLS 1.3 a server refuses a missing or unknown certificate after the
 * handshake, and its alert races our request: on a busy machine the
 * request meets a reset instead and the refusal looked transient.  A
 * certificate-request callback (SSL_CTX_set_cert_cb, called on a client
 * when the server's CertificateRequest arrives) is the fact that does not
 * depend on timing.
 *
 * Only when libcurl's TLS backend is the very OpenSSL 3 that is loaded
 * (curl_version_info says so): the context curl hands over is then an
 * SSL_CTX, and dlopen of the same soname returns the library libcurl
 * already uses.  The prototypes are declared here (OpenSSL 3's stable
 * ABI), so no libssl-dev is needed to build.  Anything else: no hook, and
 * only the alert's text classifies.
 */
#ifndef IK_SSL_DL_H
#define IK_SSL_DL_H

#include <stdint.h>

#include "dl/dl.h"

#define IK_LIBSSL "libssl.so.3"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
#define IK_SSL_OP_NO_RENEGOTIATION ((uint64_t)1 << 30)   /* SSL_OP_NO_RENEGOTIATION */

void SSL_CTX_set_cert_cb(SSL_CTX *c, int (*cb)(SSL *ssl, void *arg), void *arg);
void SSL_CTX_set_post_handshake_auth(SSL_CTX *ctx, int val);
uint64_t SSL_CTX_set_options(SSL_CTX *ctx, uint64_t op);

#define IK_SSL_FUNCS(X) \
	X(SSL_CTX_set_cert_cb) X(SSL_CTX_set_post_handshake_auth) X(SSL_CTX_set_options)

struct ik_ssl_api {
	IK_SSL_FUNCS(IK_DL_FIELD)
};
extern struct ik_ssl_api ik_ssl;

/* IK_OK, or IK_CONFIG when libssl or one of its functions is missing. */
int ik_ssl_load(ik_err *err);

#ifndef IK_SSL_DL_IMPL
#define SSL_CTX_set_cert_cb             (ik_ssl.SSL_CTX_set_cert_cb)
#define SSL_CTX_set_post_handshake_auth (ik_ssl.SSL_CTX_set_post_handshake_auth)
#define SSL_CTX_set_options             (ik_ssl.SSL_CTX_set_options)
#endif

#endif
