/* pg_err.c: the PostgreSQL store's errors as outcomes (pg_store.h): a
 * failed result by its SQLSTATE, a connect failure by libpq's text, an
 * answer that did not come in time.  Split out of store_postgres.c along
 * that seam. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "core/outcome.h"
#include "core/util.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"

/* A message on one line, without the trailing newline libpq gives. */
void
ik_pg_trim(char *s)
{
	size_t n = strlen(s);

	while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
		s[--n] = 0;
	for (char *c = s; *c; c++)
		if (*c == '\n')
			*c = ' ';
}

/* A failed result (r may be NULL: no answer at all) as an outcome. */
int
ik_pg_err(struct pg *p, PGresult *r, const char *doing, ik_err *err)
{
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	const char *m = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	char msg[512];
	int code = IK_SOFTWARE;

	snprintf(msg, sizeof msg, "%s", m ? m : p->conn ? PQerrorMessage(p->conn) : "no connection");
	ik_pg_trim(msg);
	if (!state || PQstatus(p->conn) != CONNECTION_OK || strncmp(state, "08", 2) == 0 ||
	    strncmp(state, "57P", 3) == 0 || strncmp(state, "53", 2) == 0 ||
	    strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
	    strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0)
		code = IK_TEMPFAIL;
	else if (strncmp(state, "28", 2) == 0 || strncmp(state, "42501", 5) == 0 ||
	    strcmp(state, "3D000") == 0)
		code = IK_CONFIG;
	else if (strncmp(state, "22", 2) == 0)
		code = IK_DATAERR;     /* the event cannot be stored (not UTF-8, ...) */
	else if (strcmp(state, "42P01") == 0)
		return ik_errf(err, IK_CONFIG, "postgres %s: %s: %s (run idemp-init)",
		    p->u.table, doing, msg);
	return ik_errf(err, code, "postgres %s: %s: %s%s%s", p->u.table, doing, msg,
	    state ? " " : "", state ? state : "");
}

/* A connect failure's message says a configuration error (CONFIG: leave
 * the message, alarm), not trouble that passes (TEMPFAIL).  libpq gives
 * connect failures no code, only text; this is the one list of what in
 * that text is configuration.  TLS that was asked for and cannot be had
 * is configuration: the server offers none, the CA file is missing or
 * unreadable, the certificate does not verify or names another host, our
 * client certificate or key cannot be read, the server refused our
 * certificate.  An end of file in the middle of the handshake is not (a
 * server restarting). */
int
ik_pg_connect_config(const char *msg)
{
	static const char *const config[] = {
		"authentication failed", "does not exist", "no pg_hba.conf entry",
		"invalid", "could not translate host name",
		"SSL was required",     /* sslmode=require or verify-*: the server has no TLS */
		"certificate",          /* the CA file missing or unreadable, a verification
		                         * or host name failure, our certificate refused or
		                         * unreadable */
		"private key",          /* ours, unreadable or too open */
		"alert",                /* the server's TLS alert: unknown CA, bad certificate,
		                         * no shared protocol */
		"unsupported protocol", "wrong version number", "no protocols available",
		NULL,
	};

	for (size_t i = 0; config[i]; i++)
		if (strstr(msg, config[i]))
			return 1;
	return 0;
}

/* No answer by the deadline: the connection is dropped (what the server
 * did with what was sent cannot be known: a claim it made holds until its
 * lease ends, a finish is tried again by the message's next delivery) and
 * the outcome is TEMPFAIL.  The next call connects afresh. */
int
ik_pg_late(struct pg *p, const char *doing, ik_err *err)
{
	if (p->conn) {
		PQfinish(p->conn);
		p->conn = NULL;
	}
	return ik_errf(err, IK_TEMPFAIL, "postgres %s: %s: no answer from the server within "
	    "%d ms (IDEMKIT_PG_TIMEOUT); the connection is dropped", p->u.table, doing,
	    p->timeout_ms);
}

/* Whether the connection's socket is ready for events before until (a
 * monotonic time); a socket libpq has closed is "ready": its next call
 * says why. */
static int
ready(struct pg *p, short events, int64_t until)
{
	struct pollfd pf = { .fd = PQsocket(p->conn), .events = events };
	int64_t left;
	int n;

	while (pf.fd >= 0) {
		if ((left = until - ik_mono_ms()) <= 0)
			return 0;
		if ((n = poll(&pf, 1, left > INT_MAX ? INT_MAX : (int)left)) > 0)
			return 1;
		if (n == 0)
			return 0;
		if (errno != EINTR)
			return 1;
	}
	return 1;
}

/* The answer to the statement just sent (sent: what PQsend* returned), as
 * PQexec gives it (the last result, an error result included), waited for
 * at most p->timeout_ms.  libpq's own wait has no end: a server, or a
 * middlebox, that keeps the connection open and never answers (a
 * partition TCP does not see, a paused process, a connection a failover
 * left behind) would hold the step for ever, its lease long gone.  NULL,
 * err set, when nothing could be sent or no answer came in time
 * (ik_pg_late). */
PGresult *
ik_pg_wait(struct pg *p, int sent, const char *doing, ik_err *err)
{
	int64_t until = ik_mono_ms() + p->timeout_ms;
	PGresult *r, *last = NULL;
	int fl;

	if (sent != 1) {
		ik_pg_err(p, NULL, doing, err);
		return NULL;
	}
	while ((fl = PQflush(p->conn)) > 0)
		if (!ready(p, POLLOUT, until))
			goto late;
	for (;;) {
		while (fl == 0 && PQisBusy(p->conn) && PQstatus(p->conn) == CONNECTION_OK) {
			if (!ready(p, POLLIN, until))
				goto late;
			if (PQconsumeInput(p->conn) != 1)
				break;     /* the connection failed: PQgetResult says so */
		}
		if (!(r = PQgetResult(p->conn)))
			break;
		PQclear(last);
		last = r;
		if (PQresultStatus(r) == PGRES_COPY_IN || PQresultStatus(r) == PGRES_COPY_OUT ||
		    PQresultStatus(r) == PGRES_COPY_BOTH)
			break;     /* not ours: no statement here copies */
	}
	if (!last)
		ik_pg_err(p, NULL, doing, err);
	return last;
late:
	PQclear(last);
	ik_pg_late(p, doing, err);
	return NULL;
}

PGresult *
ik_pg_exec(struct pg *p, const char *sql, int n, const char *const *params, int binary,
    const char *doing, ik_err *err)
{
	if (!p->conn)
		return ik_errf(err, IK_TEMPFAIL, "postgres %s: %s: no connection", p->u.table,
		    doing), NULL;
	return ik_pg_wait(p, PQsendQueryParams(p->conn, sql, n, NULL, params, NULL, NULL, binary),
	    doing, err);
}
