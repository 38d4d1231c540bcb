/* pg_url.c: the PostgreSQL store URL, through libpq's parser; see pg_store.h. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/outcome.h"
#include "core/util.h"
#include "dl/pq_dl.h"
#include "store/postgres/pg_store.h"

#define DEFAULT_TABLE "idemkit_records"

/* Takes table=NAME out of the URL's query string (libpq does not know it)
 * into u->table; the rest is what libpq parses.  IK_OK or IK_CONFIG.
 * *given says whether the URL named a table. */
static int
split_table(struct ik_pg_url *u, const char *url, int *given, ik_err *err)
{
	const char *q = strchr(url, '?');
	struct ik_buf b = { 0 };
	int first = 1;

	*given = 0;
	snprintf(u->table, sizeof u->table, DEFAULT_TABLE);
	if (strncmp(url, "postgres:", 9) == 0 && strncmp(url, "postgres://", 11) != 0)
		url += 9;   /* bare postgres: -> libpq's environment, or key=value */
	ik_buf_add(&b, url, q ? (size_t)(q - url) : strlen(url));
	while (q && *q) {
		const char *amp = strchr(q + 1, '&'), *end = amp ? amp : q + strlen(q);
		size_t n = (size_t)(end - (q + 1));
		if (n > 6 && strncmp(q + 1, "table=", 6) == 0) {
			size_t tn = n - 6;
			const char *t = q + 7;
			int okname = tn <= IK_PG_TABLE_MAX &&
			    (islower((unsigned char)t[0]) || t[0] == '_');
			for (size_t i = 0; okname && i < tn; i++)
				okname = islower((unsigned char)t[i]) || isdigit((unsigned char)t[i]) ||
				         t[i] == '_';
			if (!okname) {
				ik_buf_wipe_free(&b);
				return ik_errf(err, IK_CONFIG, "postgres: table=%.*s: want 1-48 of "
				    "[a-z0-9_], not starting with a digit",
				    (int)(tn > IK_PG_TABLE_MAX ? IK_PG_TABLE_MAX : tn), t);
			}
			memcpy(u->table, t, tn);
			u->table[tn] = 0;
			*given = 1;
		} else if (n) {
			ik_buf_addstr(&b, first ? "?" : "&");
			ik_buf_add(&b, q + 1, n);
			first = 0;
		}
		q = amp;
	}
	if (!b.p && !(b.p = strdup("")))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	u->conninfo = b.p;
	return IK_OK;
}

/* libpq's message about a string it could not parse, each "quoted" part
 * (which may be a piece of the password) cut out. */
static void
unquoted(const char *m, char *out, size_t outsz)
{
	size_t o = 0;
	int in = 0;

	for (; *m && o + 4 < outsz; m++) {
		if (*m == '"') {
			if (!in) {
				memcpy(out + o, "\"...\"", 5);
				o += 5;
			}
			in = !in;
		} else if (!in)
			out[o++] = *m == '\n' ? ' ' : *m;
	}
	while (o && out[o - 1] == ' ')
		o--;
	out[o] = '\0';
}

static void
add_pct(struct ik_buf *b, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";

	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
			ik_buf_add(b, s, 1);
		} else {
			char e[3] = { '%', hex[c >> 4], hex[c & 15] };
			ik_buf_add(b, e, 3);
		}
	}
}

/* A key=value string's value, quoted when it has to be. */
static void
add_kv_value(struct ik_buf *b, const char *v)
{
	if (*v && !v[strcspn(v, " \t\n\r\f\v'\\")]) {
		ik_buf_addstr(b, v);
		return;
	}
	ik_buf_addstr(b, "'");
	for (; *v; v++) {
		if (*v == '\'' || *v == '\\')
			ik_buf_addstr(b, "\\");
		ik_buf_add(b, v, 1);
	}
	ik_buf_addstr(b, "'");
}

static int
is_secret(const PQconninfoOption *o)
{
	return o->dispchar && strchr(o->dispchar, '*');
}

static const char *
opt(const PQconninfoOption *opts, const char *kw)
{
	for (const PQconninfoOption *o = opts; o->keyword; o++)
		if (strcmp(o->keyword, kw) == 0)
			return o->val;
	return NULL;
}

/* The display form of a URL holding a secret, rebuilt from what libpq
 * parsed (never from the text): the same form (URL or key=value), every
 * secret as ***.  NULL when out of memory. */
static char *
rebuilt(const struct ik_pg_url *u, const PQconninfoOption *opts, int given)
{
	struct ik_buf b = { 0 };
	const char *host = opt(opts, "host"), *port = opt(opts, "port");
	const char *user = opt(opts, "user"), *db = opt(opts, "dbname");
	const char *pw = opt(opts, "password");
	int uri = strncmp(u->conninfo, "postgres://", 11) == 0 ||
	          strncmp(u->conninfo, "postgresql://", 13) == 0, sep = 0;
	/* One plain host (not a list, a socket directory or IPv6) and one port
	 * read best where URLs put them; anything else goes in the query. */
	int inauth = uri && host && !host[strcspn(host, ",/:[")] && (!port || !strchr(port, ','));

	if (uri) {
		ik_buf_addstr(&b, u->conninfo[8] == 'q' ? "postgresql://" : "postgres://");
		if (user)
			add_pct(&b, user);
		if (pw && *pw)
			ik_buf_addstr(&b, ":***");
		if (user || (pw && *pw))
			ik_buf_addstr(&b, "@");
		if (inauth) {
			add_pct(&b, host);
			if (port && *port) {
				ik_buf_addstr(&b, ":");
				add_pct(&b, port);
			}
		}
		ik_buf_addstr(&b, "/");
		if (db)
			add_pct(&b, db);
	} else
		ik_buf_addstr(&b, "postgres:");
	for (const PQconninfoOption *o = opts; o->keyword; o++) {
		if (!o->val || (uri && (strcmp(o->keyword, "user") == 0 ||
		    strcmp(o->keyword, "dbname") == 0 || (pw && *pw &&
		    strcmp(o->keyword, "password") == 0) || (inauth &&
		    (strcmp(o->keyword, "host") == 0 || strcmp(o->keyword, "port") == 0)))))
			continue;
		ik_buf_addstr(&b, uri ? (sep++ ? "&" : "?") : (sep++ ? " " : ""));
		ik_buf_addstr(&b, o->keyword);
		ik_buf_addstr(&b, "=");
		if (is_secret(o))
			ik_buf_addstr(&b, "***");
		else if (uri)
			add_pct(&b, o->val);
		else
			add_kv_value(&b, o->val);
	}
	if (given) {
		ik_buf_addstr(&b, !uri ? " ?table=" : sep ? "&table=" : "?table=");
		ik_buf_addstr(&b, u->table);
	}
	return b.p;
}

int
ik_pg_url_parse(const char *url, struct ik_pg_url *u, ik_err *err)
{
	PQconninfoOption *opts;
	char *perr = NULL, msg[256];
	int rc, given, misread = 0;

	memset(u, 0, sizeof *u);
	if ((rc = split_table(u, url, &given, err)) != IK_OK)
		return rc;
	/* "" is libpq's environment and ~/.pgpass alone: nothing to read. */
	if (!*u->conninfo) {
		if (!(u->display = strdup(url)))
			goto nomem;
		return IK_OK;
	}
	if (!(opts = PQconninfoParse(u->conninfo, &perr))) {
		unquoted(perr ? perr : "out of memory", msg, sizeof msg);
		PQfreemem(perr);
		ik_pg_url_free(u);
		return ik_errf(err, IK_CONFIG, "postgres: bad URL: %s", msg);
	}
	for (const PQconninfoOption *o = opts; o->keyword; o++) {
		if (!o->val)
			continue;
		if (is_secret(o) && *o->val)
			u->secret = 1;
		if ((strcmp(o->keyword, "host") == 0 || strcmp(o->keyword, "dbname") == 0) &&
		    strchr(o->val, '@'))
			misread = 1;
		if (strcmp(o->keyword, "port") == 0 && o->val[strspn(o->val, "0123456789,")])
			misread = 1;
	}
	if (misread) {
		PQconninfoFree(opts);
		ik_pg_url_free(u);
		return ik_errf(err, IK_CONFIG, "postgres: bad URL: libpq reads a host or "
		    "database name with an '@' in it, or a port that is not a number: an '@' "
		    "or '/' in a password must be percent-encoded (%%40, %%2F); better, keep "
		    "the password out of the URL (PGPASSFILE)");
	}
	u->display = u->secret ? rebuilt(u, opts, given) : strdup(url);
	PQconninfoFree(opts);
	if (u->display)
		return IK_OK;
nomem:
	ik_pg_url_free(u);
	return ik_errf(err, IK_SOFTWARE, "out of memory");
}

void
ik_pg_url_free(struct ik_pg_url *u)
{
	ik_str_wipe_free(u->conninfo);
	free(u->display);
	u->conninfo = u->display = NULL;
}
