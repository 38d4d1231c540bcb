/* aws_keys.c: what every credential source of the chain fills the same
 * way (aws_int.h): the credentials set, freed and wiped, an expiry's time
 * read, a variable read.  Apart from the chain (aws_cred.c), so that its
 * sources (aws_sts.c, aws_meta.c, aws_process.c) need nothing of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aws/aws_int.h"
#include "core/outcome.h"
#include "core/util.h"

void
ik_aws_creds_free(struct ik_aws_creds *c)
{
	ik_str_wipe_free(c->ak);
	ik_str_wipe_free(c->sk);
	ik_str_wipe_free(c->tok);
	memset(c, 0, sizeof *c);
}

const char *
ik_aws_env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

/* "2026-12-01T10:00:00Z", fractions ignored; -1 when malformed. */
int64_t
ik_aws_parse_time_ms(const char *s)
{
	struct tm tm;
	int y, mo, d, h, mi, se;
	time_t t;

	if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &se) != 6)
		return -1;
	memset(&tm, 0, sizeof tm);
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = se;
	t = timegm(&tm);
	return t == (time_t)-1 ? -1 : (int64_t)t * 1000;
}

int
ik_aws_creds_set(struct ik_aws_creds *c, const char *ak, const char *sk, const char *tok,
          ik_err *err)
{
	c->ak = strdup(ak);
	c->sk = strdup(sk);
	c->tok = tok && *tok ? strdup(tok) : NULL;
	if (!c->ak || !c->sk || (tok && *tok && !c->tok))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	return IK_OK;
}
