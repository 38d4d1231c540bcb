/* pg_url.h: a PostgreSQL store URL (postgres://..., postgresql://..., or
 * postgres: followed by a libpq key=value string or nothing), read with
 * libpq's own parser (PQconninfoParse), never by searching the text.
 *
 * Rules: which options are secret is libpq's word (dispchar "*": password,
 * sslpassword), and a secret is never copied into a message or into the
 * display form.  libpq's own messages about a string it cannot parse may
 * quote any part of it, a password's included, so they are shown with
 * their quoted parts cut out.  A URL whose password holds an unencoded '@'
 * or '/' is read by libpq as another host, port or database name, which
 * its connect errors then quote: refused (IK_CONFIG) before anything
 * connects, without quoting it.  Needs ik_pq_load (pq_dl.h) first.
 */
#ifndef IK_PG_URL_H
#define IK_PG_URL_H

#include "err.h"

#define IK_PG_TABLE_MAX 48

struct ik_pg_url {
	char *conninfo;      /* for libpq: the URL without table=; wiped on free */
	char table[IK_PG_TABLE_MAX + 1];
	int secret;          /* a password (or another secret option) is in it */
	char *display;       /* for messages and output: secrets as *** */
};

/* url is the whole store URL.  IK_OK, IK_CONFIG (a bad URL, a bad
 * table=, a misread password: err says which without quoting it) or
 * IK_SOFTWARE. */
int ik_pg_url_parse(const char *url, struct ik_pg_url *u, ik_err *err);
void ik_pg_url_free(struct ik_pg_url *u);

#endif
