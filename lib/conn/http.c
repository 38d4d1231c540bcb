/* http.c: the libcurl wrapper; see http.h.
 *
 * Every request runs on the multi handle (one thread; its connection
 * cache keeps connections alive for the next request); easy handles are
 * pooled, reset and fully configured for each request, so one request's
 * options never leak into the next.  A blocking ik_http_do is a submit
 * and a wait for that one call.  Secrets pass through curl's own option copies and
 * our header list; the list entries are wiped before they are freed.
 * The status line is read by on_header as it arrives, not only from a
 * transfer that succeeded: a 2xx whose body then fails is still a 2xx.
 * The multi handle is driven by its socket interface: curl names the
 * sockets it waits on (on_socket) and when it wants to be called next
 * (on_timer); one poll(2) over those wakes only the transfers whose
 * socket is ready.  curl_multi_perform would visit every transfer in
 * flight at each wake and, in libcurl 7.x, poll each one's socket on its
 * own: about 11 poll calls per request at --inflight 64, a quarter of
 * charge-debit's CPU.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "conn/http.h"
#include "core/outcome.h"
#include "dl/curl_dl.h"
#include "dl/ssl_dl.h"

#define IK_HTTP_IDLE_MAX 64      /* easy handles kept for reuse */
#define IK_HTTP_MAX_CONNS 1024   /* idle connections kept alive, as --inflight's cap */

struct ik_http_call;

struct ik_http {
	CURLM *multi;               /* owns the connection cache */
	CURL *idle[IK_HTTP_IDLE_MAX];
	size_t nidle;
	struct ik_http_call *calls; /* started, not yet reported */
	size_t active;
	struct pollfd *socks;       /* curl's sockets and what it waits for */
	size_t nsocks, capsocks;
	struct pollfd *pfd;         /* one wait's set: socks, then the caller's */
	size_t cappfd;
	int64_t due_ms;             /* curl's timer (ik_mono_ms); -1: none */
	int sock_nomem;
};

struct sink {
	struct ik_http_res *res;
	size_t max;
	long status;                /* of the last status line read; 0: none */
	int too_big;
	int nomem;
};

static int global_done;
static int ssl_hook;            /* libcurl's TLS is OpenSSL 3, libssl loaded */

/* Whether libcurl's TLS backend is OpenSSL 3 (ssl_dl.h says why). */
static int
ssl_is_openssl3(void)
{
	const curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);

	return v && v->ssl_version && strncmp(v->ssl_version, "OpenSSL/3.", 10) == 0;
}

static int
global_init(ik_err *err)
{
	CURLcode rc;
	int lrc;

	if (global_done)
		return IK_OK;
	if ((lrc = ik_curl_load(err)) != IK_OK)
		return lrc;
	rc = curl_global_init(CURL_GLOBAL_DEFAULT);
	if (rc != CURLE_OK)
		return ik_errf(err, IK_SOFTWARE, "curl init: %s", curl_easy_strerror(rc));
	global_done = 1;
	ssl_hook = ssl_is_openssl3() && ik_ssl_load(NULL) == IK_OK;
	return IK_OK;
}

/* curl: socket s is to be waited on for what (CURL_POLL_*), or no more. */
static int
on_socket(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
	struct ik_http *h = userp;
	size_t i;

	(void)e;
	(void)socketp;
	for (i = 0; i < h->nsocks && h->socks[i].fd != s; i++)
		;
	if (what == CURL_POLL_REMOVE) {
		if (i < h->nsocks)
			h->socks[i] = h->socks[--h->nsocks];
		return 0;
	}
	if (i == h->nsocks) {
		if (h->nsocks == h->capsocks) {
			size_t cap = h->capsocks ? 2 * h->capsocks : 16;
			struct pollfd *p = realloc(h->socks, cap * sizeof *p);

			if (!p) {
				h->sock_nomem = 1;
				return -1;      /* curl fails that transfer */
			}
			h->socks = p;
			h->capsocks = cap;
		}
		h->socks[h->nsocks++] = (struct pollfd){ .fd = s };
	}
	h->socks[i].events = (short)((what & CURL_POLL_IN ? POLLIN : 0) |
	                             (what & CURL_POLL_OUT ? POLLOUT : 0));
	return 0;
}

/* curl: call me with CURL_SOCKET_TIMEOUT in ms (0: at once; -1: no timer). */
static int
on_timer(CURLM *m, long ms, void *userp)
{
	struct ik_http *h = userp;

	(void)m;
	h->due_ms = ms < 0 ? -1 : ik_mono_ms() + ms;
	return 0;
}

int
ik_http_open(struct ik_http **out, ik_err *err)
{
	struct ik_http *h;
	int rc;

	*out = NULL;
	if ((rc = global_init(err)) != IK_OK)
		return rc;
	if (!(h = calloc(1, sizeof *h)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	if (!(h->multi = curl_multi_init())) {
		free(h);
		return ik_errf(err, IK_SOFTWARE, "curl: cannot create a multi handle");
	}
	/* HTTP/2 streams share one connection when the server offers it;
	 * HTTP/1.1 requests in flight each take a kept-alive connection. */
	curl_multi_setopt(h->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
	/* Keep the connections of a burst for the next one (curl's default
	 * cache shrinks with the number of transfers in flight). */
	curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, (long)IK_HTTP_MAX_CONNS);
	h->due_ms = -1;
	curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
	curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
	curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, on_timer);
	curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
	*out = h;
	return IK_OK;
}

static size_t
on_body(char *p, size_t size, size_t n, void *arg)
{
	struct sink *s = arg;
	size_t len = size * n;

	if (s->res->body.len + len > s->max) {
		s->too_big = 1;
		return 0;
	}
	if (ik_buf_add(&s->res->body, p, len) < 0) {
		s->nomem = 1;
		return 0;
	}
	return len;
}

/* The status of a status line ("HTTP/1.1 201 Created", "HTTP/2 201"),
 * 0 when it has none. */
static long
status_of(const char *p, size_t len)
{
	size_t i = 5;

	while (i < len && p[i] != ' ')
		i++;
	if (len - i < 4 || !isdigit((unsigned char)p[i + 1]) ||
	    !isdigit((unsigned char)p[i + 2]) || !isdigit((unsigned char)p[i + 3]) ||
	    (len - i > 4 && isdigit((unsigned char)p[i + 4])))
		return 0;
	return (p[i + 1] - '0') * 100 + (p[i + 2] - '0') * 10 + (p[i + 3] - '0');
}

/* One header line per call, with its CRLF.  A status line starts a new
 * response (after a 100 Continue or an interim reply): forget the old one. */
static size_t
on_header(char *p, size_t size, size_t n, void *arg)
{
	struct sink *s = arg;
	size_t len = size * n, nl, vs, ve;
	const char *colon;

	if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) {
		ik_buf_reset(&s->res->hdrs);
		s->status = status_of(p, len);
		return len;
	}
	colon = memchr(p, ':', len);
	if (!colon)
		return len;               /* the blank line that ends the block */
	nl = (size_t)(colon - p);
	while (nl > 0 && (p[nl - 1] == ' ' || p[nl - 1] == '\t'))
		nl--;
	vs = (size_t)(colon - p) + 1;
	ve = len;
	while (vs < ve && (p[vs] == ' ' || p[vs] == '\t'))
		vs++;
	while (ve > vs && isspace((unsigned char)p[ve - 1]))
		ve--;
	if (nl == 0)
		return len;
	if (ik_buf_add(&s->res->hdrs, p, nl) < 0 ||
	    ik_buf_add(&s->res->hdrs, "", 1) < 0 ||
	    ik_buf_add(&s->res->hdrs, p + vs, ve - vs) < 0 ||
	    ik_buf_add(&s->res->hdrs, "", 1) < 0) {
		s->nomem = 1;
		return 0;
	}
	return len;
}

const char *
ik_http_header(const struct ik_http_res *res, const char *name)
{
	const char *p, *end, *v;

	if (!res->hdrs.p)
		return NULL;
	p = res->hdrs.p;
	end = p + res->hdrs.len;
	while (p < end) {
		v = p + strlen(p) + 1;
		if (v >= end)
			break;
		if (strcasecmp(p, name) == 0)
			return v;
		p = v + strlen(v) + 1;
	}
	return NULL;
}

void
ik_http_res_free(struct ik_http_res *res)
{
	if (!res)
		return;
	ik_buf_wipe_free(&res->body);
	ik_buf_free(&res->hdrs);
	res->status = 0;
}

static void
slist_wipe_free(struct curl_slist *l)
{
	struct curl_slist *i;

	for (i = l; i; i = i->next)
		if (i->data)
			sodium_memzero(i->data, strlen(i->data));
	curl_slist_free_all(l);
}

/* The host (and port) of url, for error messages: never the path, query or
 * user info.  IK_CONFIG when the URL does not parse or is not http(s). */
static int
url_host(const char *url, char *host, size_t hostsz, ik_err *err)
{
	CURLU *u;
	CURLUcode uc;
	char *h = NULL, *scheme = NULL, *port = NULL;
	int rc = IK_OK;

	snprintf(host, hostsz, "?");
	if (!url || !*url)
		return ik_errf(err, IK_CONFIG, "empty URL");
	if ((rc = ik_curl_load(err)) != IK_OK)
		return rc;
	if (!(u = curl_url()))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	uc = curl_url_set(u, CURLUPART_URL, url, 0);
	if (uc != CURLUE_OK) {
		rc = ik_errf(err, IK_CONFIG, "malformed URL: %s", curl_url_strerror(uc));
		goto out;
	}
	if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)) {
		rc = ik_errf(err, IK_CONFIG, "unsupported URL scheme %.16s (want http or https)",
		             scheme ? scheme : "?");
		goto out;
	}
	if (curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK) {
		rc = ik_errf(err, IK_CONFIG, "malformed URL: no host");
		goto out;
	}
	if (curl_url_get(u, CURLUPART_PORT, &port, 0) == CURLUE_OK && port)
		snprintf(host, hostsz, "%.200s:%.8s", h, port);
	else
		snprintf(host, hostsz, "%.200s", h);
out:
	curl_free(h);
	curl_free(scheme);
	curl_free(port);
	curl_url_cleanup(u);
	return rc;
}

static int
is_loopback(const char *h)
{
	struct in_addr a4;
	struct in6_addr a6;
	char b[64];
	size_t n = strlen(h);

	if (strcasecmp(h, "localhost") == 0)
		return 1;   /* libcurl resolves it to loopback itself, never via DNS */
	if (inet_pton(AF_INET, h, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (n < 3 || n >= sizeof b || h[0] != '[' || h[n - 1] != ']')
		return 0;
	memcpy(b, h + 1, n - 2);
	b[n - 2] = '\0';
	if (inet_pton(AF_INET6, b, &a6) != 1)
		return 0;
	if (IN6_IS_ADDR_LOOPBACK(&a6))
		return 1;
	return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

int
ik_http_url_parse(const char *url, struct ik_http_url *out, ik_err *err)
{
	CURLU *u;
	char *scheme = NULL, *h = NULL, *path = NULL, *query = NULL;
	int rc;

	memset(out, 0, sizeof *out);
	if ((rc = url_host(url, out->host, sizeof out->host, err)) != IK_OK)
		return rc;
	if (!(u = curl_url()))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	rc = IK_OK;
	if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK) {
		rc = ik_errf(err, IK_CONFIG, "%s: malformed URL", out->host);
		goto done;
	}
	curl_url_get(u, CURLUPART_QUERY, &query, 0);   /* absent: stays NULL */
	out->https = strcasecmp(scheme, "https") == 0;
	out->loopback = is_loopback(h);
	if (!(out->path = malloc(strlen(path) + (query ? strlen(query) + 1 : 0) + 1))) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto done;
	}
	strcpy(out->path, path);
	if (query)
		strcat(strcat(out->path, "?"), query);
done:
	curl_free(scheme);
	curl_free(h);
	curl_free(path);
	curl_free(query);
	curl_url_cleanup(u);
	return rc;
}

void
ik_http_url_free(struct ik_http_url *u)
{
	free(u->path);
	u->path = NULL;
}

static int
classify(CURLcode rc)
{
	switch (rc) {
	case CURLE_UNSUPPORTED_PROTOCOL:
	case CURLE_URL_MALFORMAT:
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_SSL_CRL_BADFILE:
	case CURLE_SSL_ISSUER_ERROR:
	case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
		return IK_CONFIG;
	case CURLE_OUT_OF_MEMORY:
	case CURLE_NOT_BUILT_IN:
	case CURLE_UNKNOWN_OPTION:
	case CURLE_BAD_FUNCTION_ARGUMENT:
		return IK_SOFTWARE;
	default:
		return IK_TEMPFAIL;
	}
}

/* A handshake the server refused with a TLS alert (116
 * certificate_required, 42 bad_certificate, 48 unknown_ca, 46
 * certificate_unknown, 45 certificate_expired, 44 certificate_revoked, 40
 * handshake_failure: what TLS 1.2 servers send for a missing certificate
 * or no common cipher, as OpenSSL names them): the two ends' configuration
 * disagrees, retrying will not help.  A reset or a timeout mid-handshake
 * stays transient.  libcurl gives one code for all of
 * them (35, or 56 when TLS 1.3 sends the alert after the handshake), so
 * the alert is read from its message. */
static int
tls_refused(CURLcode rc, const char *msg)
{
	static const char *const alerts[] = { "alert certificate required",
		"alert bad certificate", "alert unknown ca", "alert certificate unknown",
		"alert certificate expired", "alert certificate revoked",
		"alert handshake failure", NULL };
	size_t i;

	if (rc != CURLE_SSL_CONNECT_ERROR && rc != CURLE_RECV_ERROR && rc != CURLE_SEND_ERROR)
		return 0;
	for (i = 0; alerts[i]; i++)
		if (strstr(msg, alerts[i]))
			return 1;
	return 0;
}

#define SET(opt, val) do { \
	if ((cc = curl_easy_setopt(c, opt, val)) != CURLE_OK) goto curl_fail; \
} while (0)

/* One request started by ik_http_submit (or ik_http_do), until its
 * completion is reported. */
struct ik_http_call {
	struct ik_http *h;
	CURL *curl;
	struct curl_slist *hl;
	struct sink sink;
	char host[256];
	char errbuf[CURL_ERROR_SIZE];
	ik_http_cb cb;              /* NULL: ik_http_do's own call */
	void *arg;
	int done;                   /* finished; rc and err hold the result */
	int cert_asked;             /* the server asked for a client certificate
	                               in the handshake of a connection made for us */
	int cert_sent;              /* one was configured */
	int rc;
	ik_err err;
	struct ik_http_call *next;
};

static CURL *
easy_get(struct ik_http *h)
{
	if (h->nidle)
		return h->idle[--h->nidle];
	return curl_easy_init();
}

static void
easy_put(struct ik_http *h, CURL *c)
{
	curl_easy_reset(c);   /* drops curl's copies of the credentials */
	if (h->nidle < IK_HTTP_IDLE_MAX)
		h->idle[h->nidle++] = c;
	else
		curl_easy_cleanup(c);
}

static void
call_free(struct ik_http_call *k)
{
	slist_wipe_free(k->hl);
	sodium_memzero(k->err.msg, sizeof k->err.msg);
	free(k);
}

/* A refusal of our certificate whatever the timing: the server asked for
 * one in the handshake made for this call, and the connection then ended
 * (reset, closed, an alert) before any status line.  With TLS 1.3 the
 * server's verdict comes after the handshake and races our request, so
 * the alert is often lost to a reset.  1: none was sent; 2: one was sent;
 * 0: not this case (a timeout or a status stays what it was). */
static int
cert_refused(const struct ik_http_call *k, CURLcode cc)
{
	if (!k->cert_asked || k->sink.status)
		return 0;
	if (cc != CURLE_SSL_CONNECT_ERROR && cc != CURLE_RECV_ERROR &&
	    cc != CURLE_SEND_ERROR && cc != CURLE_GOT_NOTHING)
		return 0;
	return k->cert_sent ? 2 : 1;
}

/* OpenSSL's callback when the server's CertificateRequest arrives, in the
 * handshake of a connection made for call arg. */
static int
on_cert_request(SSL *ssl, void *arg)
{
	struct ik_http_call *k = arg;

	k->cert_asked = 1;
	return 1;                   /* go on: send what is configured, if anything */
}

/* libcurl's hook on each new TLS context, before its handshake.  The
 * callback points at k, which lives only as long as its transfer: so no
 * later request for a certificate on that connection (TLS 1.3
 * post-handshake authentication, TLS 1.2 renegotiation) is allowed to
 * reach it; curl needs neither. */
static CURLcode
on_ssl_ctx(CURL *c, void *sslctx, void *arg)
{
	SSL_CTX_set_cert_cb(sslctx, on_cert_request, arg);
	SSL_CTX_set_post_handshake_auth(sslctx, 0);
	SSL_CTX_set_options(sslctx, IK_SSL_OP_NO_RENEGOTIATION);
	return CURLE_OK;
}

/* libcurl's hook on each socket it makes, before the connect: every close
 * of it is abortive (SO_LINGER {1, 0}: an RST, the send queue dropped).
 * A plain close keeps retransmitting what the peer has not acknowledged,
 * after the socket is gone: a request we gave up on (a timeout while the
 * path was cut, a connection closed at exit, a process killed) would reach
 * the bank when the path comes back, tens of seconds later, after we
 * reported TEMPFAIL and a retry may have run.  With the linger at zero
 * nothing we abandoned is sent again; what the peer already acknowledged
 * it has, and the Idempotency-Key covers that.  Set on the socket, not at
 * our close: the kernel applies it to every close, an exit's included. */
static int
on_sockopt(void *arg, curl_socket_t s, curlsocktype purpose)
{
	struct linger l = { .l_onoff = 1, .l_linger = 0 };

	(void)arg;
	(void)purpose;
	if (setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l) != 0)
		return CURL_SOCKOPT_ERROR;    /* the request fails, never sent */
	return CURL_SOCKOPT_OK;
}

/* Configures k's easy handle for req; IK_OK or an error in err. */
static int
configure(struct ik_http_call *k, const struct ik_http_req *req, ik_err *err)
{
	CURL *c = k->curl;
	CURLcode cc = CURLE_OK;
	struct curl_slist *t;
	const char *method;
	const char *const *hp;
	int https = strncasecmp(req->url, "https:", 6) == 0;

	method = req->method ? req->method : (req->body ? "POST" : "GET");

	/* Our own Expect: keeps curl from waiting for a 100 Continue on
	 * larger bodies; a server that answers early is still read.  Not when
	 * signing: libcurl 7.88 would name the removed header in SignedHeaders
	 * (curl issue 11664, fixed in 8.3), which AWS may refuse; there a short
	 * CURLOPT_EXPECT_100_TIMEOUT_MS bounds the wait instead. */
	if (!req->sigv4) {
		if (!(t = curl_slist_append(k->hl, "Expect:")))
			goto nomem;
		k->hl = t;
	}
	for (hp = req->headers; hp && *hp; hp++) {
		if (!(t = curl_slist_append(k->hl, *hp)))
			goto nomem;
		k->hl = t;
	}

	curl_easy_reset(c);
	SET(CURLOPT_URL, req->url);
	SET(CURLOPT_PROTOCOLS_STR, "http,https");
	SET(CURLOPT_NOSIGNAL, 1L);
	SET(CURLOPT_FOLLOWLOCATION, 0L);
	SET(CURLOPT_SSL_VERIFYPEER, 1L);
	SET(CURLOPT_SSL_VERIFYHOST, 2L);
	if (https) {
		/* HTTP/2 when the server offers it in ALPN; a new request then
		 * waits for a connection it can share rather than opening one. */
		SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
		SET(CURLOPT_PIPEWAIT, 1L);
	}
	if (req->cacert)
		SET(CURLOPT_CAINFO, req->cacert);
	if (req->client_cert) {
		SET(CURLOPT_SSLCERT, req->client_cert);
		SET(CURLOPT_SSLCERTTYPE, "PEM");
		SET(CURLOPT_SSLKEY, req->client_key);
		SET(CURLOPT_SSLKEYTYPE, "PEM");
		k->cert_sent = 1;
	}
	if (https && ssl_hook) {
		SET(CURLOPT_SSL_CTX_FUNCTION, on_ssl_ctx);
		SET(CURLOPT_SSL_CTX_DATA, (void *)k);
	}
	/* "" turns off the proxies libcurl would take from the environment
	 * itself (http.h: never for plain http). */
	if (!https || (!req->proxy && !req->env_proxy))
		SET(CURLOPT_PROXY, "");
	else if (req->proxy)
		SET(CURLOPT_PROXY, req->proxy);
	/* The proxy's own answer to CONNECT never reads as the server's. */
	SET(CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
	SET(CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms > 0 ? req->connect_timeout_ms : 3000L);
	SET(CURLOPT_TIMEOUT_MS, req->timeout_ms > 0 ? req->timeout_ms : 10000L);
	SET(CURLOPT_USERAGENT, "idemkit/" IK_VERSION);
	SET(CURLOPT_ERRORBUFFER, k->errbuf);
	SET(CURLOPT_WRITEFUNCTION, on_body);
	SET(CURLOPT_WRITEDATA, &k->sink);
	SET(CURLOPT_HEADERFUNCTION, on_header);
	SET(CURLOPT_HEADERDATA, &k->sink);
	SET(CURLOPT_HTTPHEADER, k->hl);
	SET(CURLOPT_PRIVATE, (void *)k);
	SET(CURLOPT_SOCKOPTFUNCTION, on_sockopt);
	if (req->sigv4)
		SET(CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);

	if (strcmp(method, "GET") == 0) {
		SET(CURLOPT_HTTPGET, 1L);
	} else if (strcmp(method, "HEAD") == 0) {
		SET(CURLOPT_NOBODY, 1L);
	} else {
		SET(CURLOPT_POST, 1L);
		SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(req->body ? req->body_len : 0));
		SET(CURLOPT_POSTFIELDS, req->body ? req->body : "");
		if (strcmp(method, "POST") != 0)
			SET(CURLOPT_CUSTOMREQUEST, method);
	}
	if (req->sigv4) {
		SET(CURLOPT_AWS_SIGV4, req->sigv4);
		SET(CURLOPT_USERNAME, req->access_key ? req->access_key : "");
		SET(CURLOPT_PASSWORD, req->secret_key ? req->secret_key : "");
	}
	return IK_OK;

curl_fail:
	return ik_errf(err, classify(cc), "%s: %s", k->host, curl_easy_strerror(cc));
nomem:
	return ik_errf(err, IK_SOFTWARE, "out of memory");
}

static int
submit(struct ik_http *h, const struct ik_http_req *req, struct ik_http_res *res,
       ik_http_cb cb, void *arg, struct ik_http_call **out, ik_err *err)
{
	struct ik_http_call *k;
	CURLMcode mc;
	int rc;

	ik_http_res_free(res);
	if (!(k = calloc(1, sizeof *k)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	k->h = h;
	k->cb = cb;
	k->arg = arg;
	k->sink.res = res;
	k->sink.max = req->max_body ? req->max_body : IK_HTTP_MAX_BODY;
	if ((rc = url_host(req->url, k->host, sizeof k->host, err)) != IK_OK)
		goto fail;
	if (req->cacert && access(req->cacert, R_OK) != 0) {
		rc = ik_errf(err, IK_CONFIG, "%s: CA file %.200s is not readable",
		             k->host, req->cacert);
		goto fail;
	}
	if (!(k->curl = easy_get(h))) {
		rc = ik_errf(err, IK_SOFTWARE, "curl: cannot create a handle");
		goto fail;
	}
	if ((rc = configure(k, req, err)) != IK_OK)
		goto fail;
	if ((mc = curl_multi_add_handle(h->multi, k->curl)) != CURLM_OK) {
		rc = ik_errf(err, IK_SOFTWARE, "curl: %s", curl_multi_strerror(mc));
		goto fail;
	}
	k->next = h->calls;
	h->calls = k;
	h->active++;
	*out = k;
	return IK_OK;
fail:
	if (k->curl)
		easy_put(h, k->curl);
	call_free(k);
	return rc;
}

int
ik_http_submit(struct ik_http *h, const struct ik_http_req *req, struct ik_http_res *res,
               ik_http_cb cb, void *arg, ik_err *err)
{
	struct ik_http_call *k;

	return submit(h, req, res, cb, arg, &k, err);
}

size_t
ik_http_active(const struct ik_http *h)
{
	return h ? h->active : 0;
}

/* The transfer of k ended with cc: its result into k->rc and k->err, the
 * handle back to the pool, the header copies wiped. */
static void
finish(struct ik_http_call *k, CURLcode cc)
{
	struct ik_http *h = k->h;
	struct ik_http_res *res = k->sink.res;
	long status = k->sink.status;
	int code;

	if (cc == CURLE_OK)
		curl_easy_getinfo(k->curl, CURLINFO_RESPONSE_CODE, &res->status);
	curl_multi_remove_handle(h->multi, k->curl);
	easy_put(h, k->curl);
	k->curl = NULL;
	slist_wipe_free(k->hl);
	k->hl = NULL;
	k->done = 1;
	k->rc = IK_OK;
	if (k->sink.nomem || k->sink.too_big || cc != CURLE_OK) {
		ik_http_res_free(res);  /* no half response for the caller, */
		res->status = status;   /* but the status that arrived (http.h) */
	}
	if (k->sink.nomem)
		k->rc = ik_errf(&k->err, IK_SOFTWARE, "%s: out of memory reading the response",
		                k->host);
	else if (k->sink.too_big)
		k->rc = ik_errf(&k->err, IK_TEMPFAIL, "%s: response larger than %zu bytes",
		                k->host, k->sink.max);
	else if (cc != CURLE_OK && (code = cert_refused(k, cc)) != 0)
		k->rc = ik_errf(&k->err, IK_CONFIG, "%s: the server asked for a client "
		                "certificate (%s) and closed the connection without an answer: %s",
		                k->host, code == 1 ? "none was sent" : "the one sent was not accepted",
		                k->errbuf[0] ? k->errbuf : curl_easy_strerror(cc));
	else if (cc != CURLE_OK)
		k->rc = ik_errf(&k->err, tls_refused(cc, k->errbuf) ? IK_CONFIG : classify(cc),
		                "%s: %s", k->host, k->errbuf[0] ? k->errbuf : curl_easy_strerror(cc));
	else if (res->status == 0)
		k->rc = ik_errf(&k->err, IK_TEMPFAIL, "%s: no HTTP response", k->host);
	else if (!res->body.p) {        /* callers may always read body.p */
		if (!(res->body.p = calloc(1, 1)))
			k->rc = ik_errf(&k->err, IK_SOFTWARE, "out of memory");
		else
			res->body.cap = 1;
	}
}

static int
action(struct ik_http *h, curl_socket_t s, int ev, ik_err *err)
{
	CURLMcode mc;
	int running;

	if ((mc = curl_multi_socket_action(h->multi, s, ev, &running)) != CURLM_OK)
		return ik_errf(err, IK_SOFTWARE, "curl: %s", curl_multi_strerror(mc));
	if (h->sock_nomem) {
		h->sock_nomem = 0;
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	return IK_OK;
}

/* Lets curl move on the transfers whose timer is due, and marks those
 * that ended. */
static int
progress(struct ik_http *h, ik_err *err)
{
	CURLMsg *m;
	int left, rc;
	void *p;

	/* cleared first: curl sets the next one from in here */
	if (h->due_ms >= 0 && ik_mono_ms() >= h->due_ms) {
		h->due_ms = -1;
		if ((rc = action(h, CURL_SOCKET_TIMEOUT, 0, err)) != IK_OK)
			return rc;
	}
	while ((m = curl_multi_info_read(h->multi, &left))) {
		if (m->msg != CURLMSG_DONE)
			continue;
		p = NULL;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &p);
		if (p)
			finish(p, m->data.result);
	}
	return IK_OK;
}

static void
unlink_call(struct ik_http *h, struct ik_http_call *k)
{
	struct ik_http_call **pp;

	for (pp = &h->calls; *pp; pp = &(*pp)->next)
		if (*pp == k) {
			*pp = k->next;
			break;
		}
	h->active--;
}

/* Runs the callback of one finished call started by ik_http_submit;
 * 0 when there was none. */
static int
deliver_one(struct ik_http *h)
{
	struct ik_http_call *k;

	for (k = h->calls; k; k = k->next)
		if (k->done && k->cb) {
			unlink_call(h, k);
			k->cb(k->arg, k->rc, k->sink.res, &k->err);
			call_free(k);
			return 1;
		}
	return 0;
}

static int
has_done(const struct ik_http *h)
{
	const struct ik_http_call *k;

	for (k = h->calls; k; k = k->next)
		if (k->done && k->cb)
			return 1;
	return 0;
}

/* One poll(2) over curl's sockets and fds, up to timeout_ms (-1: no
 * bound) or curl's timer, whichever comes first; then curl is told which
 * sockets are ready.  A signal ends the wait early (IK_OK). */
static int
wait_ready(struct ik_http *h, struct pollfd *fds, unsigned nfds, int timeout_ms,
           ik_err *err)
{
	size_t n = h->nsocks + nfds, i;
	int64_t left;
	int ms = timeout_ms, got, rc, ev;

	if (n > h->cappfd) {
		struct pollfd *p = realloc(h->pfd, n * sizeof *p);

		if (!p)
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		h->pfd = p;
		h->cappfd = n;
	}
	/* a copy: curl changes socks from the actions below */
	for (i = 0; i < h->nsocks; i++)
		h->pfd[i] = (struct pollfd){ .fd = h->socks[i].fd, .events = h->socks[i].events };
	for (i = 0; i < nfds; i++)
		h->pfd[h->nsocks + i] = (struct pollfd){ .fd = fds[i].fd, .events = fds[i].events };
	if (h->due_ms >= 0) {
		left = h->due_ms - ik_mono_ms();
		left = left < 0 ? 0 : left;
		if (ms < 0 || left < ms)
			ms = (int)(left > INT_MAX ? INT_MAX : left);
	}
	got = poll(h->pfd, (nfds_t)n, ms);
	if (got < 0 && errno != EINTR)
		return ik_errf(err, IK_SOFTWARE, "poll: %s", strerror(errno));
	if (got <= 0)
		return IK_OK;           /* the time is up, or a signal */
	for (i = 0; i < nfds; i++)
		fds[i].revents = h->pfd[h->nsocks + i].revents;
	for (i = 0, n = h->nsocks; i < n; i++) {
		short r = h->pfd[i].revents;

		if (!r)
			continue;
		ev = (r & (POLLIN | POLLHUP) ? CURL_CSELECT_IN : 0) |
		     (r & POLLOUT ? CURL_CSELECT_OUT : 0) |
		     (r & (POLLERR | POLLNVAL) ? CURL_CSELECT_ERR : 0);
		if ((rc = action(h, h->pfd[i].fd, ev, err)) != IK_OK)
			return rc;
	}
	return IK_OK;
}

int
ik_http_run(struct ik_http *h, struct pollfd *fds, unsigned nfds, int timeout_ms,
            ik_err *err)
{
	unsigned i;
	int rc;

	if (nfds > IK_HTTP_EXTRA_FDS)
		return ik_errf(err, IK_SOFTWARE, "ik_http_run: too many descriptors");
	for (i = 0; i < nfds; i++)
		fds[i].revents = 0;
	if ((rc = progress(h, err)) != IK_OK)
		return rc;
	if (!has_done(h)) {
		if ((rc = wait_ready(h, fds, nfds, timeout_ms, err)) != IK_OK)
			return rc;
		if ((rc = progress(h, err)) != IK_OK)
			return rc;
	}
	while (deliver_one(h))
		;
	return IK_OK;
}

/* Submit and wait for this one call.  Others in flight move on meanwhile;
 * their callbacks wait for the next ik_http_run, so none runs from in
 * here (a callback may itself call ik_http_do). */
int
ik_http_do(struct ik_http *h, const struct ik_http_req *req,
           struct ik_http_res *res, ik_err *err)
{
	struct ik_http_call *k;
	int rc;

	if ((rc = submit(h, req, res, NULL, NULL, &k, err)) != IK_OK)
		return rc;
	for (;;) {
		if ((rc = progress(h, err)) != IK_OK)
			break;
		if (k->done) {
			rc = k->rc;
			if (rc != IK_OK)
				*err = k->err;
			break;
		}
		if ((rc = wait_ready(h, NULL, 0, 1000, err)) != IK_OK)
			break;
	}
	if (!k->done) {            /* a multi failure: abandon the transfer */
		curl_multi_remove_handle(h->multi, k->curl);
		easy_put(h, k->curl);
		ik_http_res_free(res);
	}
	unlink_call(h, k);
	call_free(k);
	return rc;
}

void
ik_http_close(struct ik_http *h)
{
	struct ik_http_call *k;

	if (!h)
		return;
	while ((k = h->calls)) {    /* abandoned: never reported */
		h->calls = k->next;
		if (k->curl) {
			curl_multi_remove_handle(h->multi, k->curl);
			curl_easy_cleanup(k->curl);
		}
		ik_http_res_free(k->sink.res);
		call_free(k);
	}
	while (h->nidle)
		curl_easy_cleanup(h->idle[--h->nidle]);
	curl_multi_cleanup(h->multi);
	free(h->socks);
	free(h->pfd);
	free(h);
}
