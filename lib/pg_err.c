/* pg_err.c: the PostgreSQL store's errors as outcomes (pg_store.h): a
 * failed result by its SQLSTATE, a connect failure by libpq's text.  Split
 * out of store_postgres.c along that seam. */
#include <stdio.h>
#include <string.h>

#include "outcome.h"
#include "pg_store.h"
#include "pq_dl.h"

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
