/* bankapi_conf.c: what the bank API's files (bankapi.c, the endpoint and
 * its requests; bankapi_oauth.c, the OAuth2 token) both read: the
 * IDEMKIT_<P>_* variables, a token's alphabet, and the class of an answer's
 * status.  Apart from bankapi.c, so that the token's file needs nothing of
 * the endpoint's; see bankapi_int.h. */
#include <stdio.h>
#include <stdlib.h>

#include "bank/bankapi_int.h"
#include "core/outcome.h"

const char *
ik_bankapi_env(const char *prefix, const char *name, char *buf, size_t n)
{
	const char *v;
	snprintf(buf, n, "IDEMKIT_%s_%s", prefix, name);
	v = getenv(buf);
	return v && *v ? v : NULL;
}

int
ik_bankapi_token_ok(const char *s, size_t n)
{
	size_t i;
	for (i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
			return 0;
	return n > 0;
}

int
ik_bankapi_classify(const struct ik_bankapi *a, long status)
{
	if (status >= 200 && status < 300)
		return IK_OK;
	if (status >= 100 && status < 600 && a->cls[status])
		return a->cls[status];
	return IK_CONFIG;   /* not a debit endpoint's answer, or not ours to guess */
}
