/* http.h: the one libcurl wrapper (bank API, notifications, AWS).
 *
 * A handle wraps one curl multi handle (and a pool of easy handles), so
 * the requests of a process share kept-alive connections, and many can be
 * in flight at once from one thread: ik_http_submit starts one,
 * ik_http_run moves them all on (polling the caller's descriptors too)
 * and reports each finished one to its callback.  curl_global_init (TLS set-up, ~5 ms) runs lazily the
 * first time a handle is opened: commands that make no HTTP call never pay
 * for it.  TLS peer and host verification are always on.
 *
 * ik_http_do returns IK_OK whenever an HTTP response arrived, whatever its
 * status: the caller classifies status codes.  Otherwise:
 *   IK_TEMPFAIL  could not connect, timed out, transport error, response
 *                larger than the cap;
 *   IK_CONFIG    malformed URL, unsupported scheme, TLS certificate
 *                verification failure, unreadable CA file, a client
 *                certificate that cannot be used, or a handshake the server
 *                refused for our certificate (missing, unknown CA, bad:
 *                the server's alert, or, when TLS 1.3 lets the alert race
 *                our request, a server that asked for a certificate and
 *                closed the new connection without an answer);
 *   IK_SOFTWARE  out of memory, libcurl lacking a needed feature.
 * A response whose status line arrived but whose body did not arrive
 * whole (larger than the cap, cut short, timed out) is IK_TEMPFAIL (or
 * IK_SOFTWARE, out of memory) with res->status set and no body: for a caller to whom the status alone is
 * the answer (a bank's 2xx: the money moved).  Otherwise res->status is 0
 * on failure.
 * The message names the host and curl's reason; never a header value, the
 * URL's path or query, or a secret.
 *
 * Proxies: a plain http:// request never goes through one, whatever the
 * environment says (http_proxy, ALL_PROXY...): what it carries (a bearer
 * token, a signed request, a session token) would reach the proxy in
 * cleartext, and the proxy's own answer would pass for the server's.  An
 * https:// request goes through req->proxy when the caller gives one, or
 * through the environment's (https_proxy, HTTPS_PROXY, ALL_PROXY, NO_PROXY,
 * read by libcurl) when req->env_proxy is set; either way as a CONNECT
 * tunnel, so TLS still runs end to end with the server.
 */
#ifndef IK_HTTP_H
#define IK_HTTP_H

#include <stddef.h>

#include "core/err.h"
#include "core/util.h"

#define IK_HTTP_MAX_BODY (16u << 20)   /* default response body cap */

struct ik_http;

struct ik_http_req {
	const char *method;          /* "GET", "POST", "PUT", ...; NULL: POST when
	                                body is set, else GET */
	const char *url;             /* http:// or https:// */
	const char *const *headers;  /* NULL-terminated "Name: value", or NULL */
	const char *body;            /* may be NULL */
	size_t body_len;
	long connect_timeout_ms;     /* 0: 3000 */
	long timeout_ms;             /* total; 0: 10000 */
	size_t max_body;             /* 0: IK_HTTP_MAX_BODY */
	const char *cacert;          /* CA bundle file; NULL: the system's */
	const char *client_cert;     /* PEM client certificate (mutual TLS), or NULL */
	const char *client_key;      /* its PEM private key, with client_cert */
	const char *proxy;           /* https:// only: this proxy URL; NULL: none */
	int env_proxy;               /* https:// only, no proxy given: the
	                                environment's (the AWS CLI's rule) */
	/* SigV4 signing by libcurl: "aws:amz:REGION:SERVICE", or NULL. */
	const char *sigv4;
	const char *access_key;      /* with sigv4 */
	const char *secret_key;      /* with sigv4 */
};

struct ik_http_res {
	long status;                 /* HTTP status of the final response */
	struct ik_buf body;          /* wiped and freed by ik_http_res_free */
	struct ik_buf hdrs;          /* packed "name\0value\0" pairs; use ik_http_header */
};

/* IK_OK, or IK_SOFTWARE/IK_CONFIG when curl cannot be initialised. */
int ik_http_open(struct ik_http **out, ik_err *err);
void ik_http_close(struct ik_http *h);      /* NULL is fine */

/* Blocks until req is answered.  Other submitted requests move on
 * meanwhile, but their callbacks wait for ik_http_run.
 * res must be zeroed (or freed) before the first call; it is reset on each
 * call.  Header values in req are wiped from the copies made here. */
int ik_http_do(struct ik_http *h, const struct ik_http_req *req,
               struct ik_http_res *res, ik_err *err);

/* A finished submitted request: rc and err as ik_http_do would return
 * them (err only when rc != IK_OK), res the response given to
 * ik_http_submit.  Called from ik_http_run only; it may submit more
 * requests and call ik_http_do. */
typedef void (*ik_http_cb)(void *arg, int rc, struct ik_http_res *res, const ik_err *err);

/* Starts req without waiting.  IK_OK: cb will be called exactly once,
 * from a later ik_http_run; req->body (not copied) and res must stay
 * valid until then; the headers are copied.  Any other code: nothing was
 * started, cb is never called. */
int ik_http_submit(struct ik_http *h, const struct ik_http_req *req, struct ik_http_res *res,
                   ik_http_cb cb, void *arg, ik_err *err);

/* How many submitted requests have not been reported yet. */
size_t ik_http_active(const struct ik_http *h);

/* Moves every transfer on and runs the callbacks of those finished.
 * When none finished yet, first waits up to timeout_ms (-1: as long as
 * it takes) for one of them, or for fds (the caller's, poll(2) style;
 * revents set, 0 when there was no wait).  IK_OK or IK_SOFTWARE. */
#define IK_HTTP_EXTRA_FDS 4
struct pollfd;
int ik_http_run(struct ik_http *h, struct pollfd *fds, unsigned nfds, int timeout_ms,
                ik_err *err);

/* The value of response header name (case-insensitive), trimmed; NULL when
 * absent.  Valid until the next ik_http_do or ik_http_res_free. */
const char *ik_http_header(const struct ik_http_res *res, const char *name);

/* What a caller checks in a URL before it sends anything there. */
struct ik_http_url {
	int https;                   /* else http */
	int loopback;                /* localhost, 127.0.0.0/8, ::1 (or ::ffff:127.x) */
	char host[256];              /* host[:port], for messages */
	char *path;                  /* path, plus "?query" when there is one; malloc */
};

/* Parses url (http or https only).  IK_OK, IK_CONFIG (malformed, another
 * scheme, no host) or IK_SOFTWARE; the message never holds the path. */
int ik_http_url_parse(const char *url, struct ik_http_url *u, ik_err *err);
void ik_http_url_free(struct ik_http_url *u);

/* Wipes the body (it may hold credentials) and frees. */
void ik_http_res_free(struct ik_http_res *res);

#endif
