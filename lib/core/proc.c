/* proc.c: what every process of idemkit says and checks the same way,
 * below the commands; see proc.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/proc.h"
#include "core/util.h"

void
ik_warnx(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", ik_prog());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void
ik_warnk(const char *key, const char *fmt, ...)
{
	static const char plain[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	    "0123456789._:-";
	struct ik_jbuf q = { 0 };
	va_list ap;

	if (*key && key[strspn(key, plain)] == '\0')
		fprintf(stderr, "%s: %s: ", ik_prog(), key);
	else {
		ik_jbuf_str(&q, key);
		fprintf(stderr, "%s: %.*s: ", ik_prog(), q.oom ? 1 : (int)q.len,
		    q.oom ? "?" : q.p);
		free(q.p);
	}
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int
ik_opt_duration(const char *opt, const char *s, int64_t min_ms, int64_t max_ms, int64_t *ms)
{
	if (ik_parse_duration(s, ms) < 0 || *ms < min_ms || *ms > max_ms) {
		if (max_ms == INT64_MAX) {
			ik_warnx("%s: \"%s\" is not a duration of at least %lldms (e.g. 90s, 5m)",
			    opt, s, (long long)min_ms);
			return -1;
		}
		ik_warnx("%s: \"%s\" is not a duration from %lldms to %llds (e.g. 500ms, 30s, 5m)",
		    opt, s, (long long)min_ms, (long long)(max_ms / 1000));
		return -1;
	}
	return 0;
}

int
ik_opt_int(const char *opt, const char *s, long long min, long long max, long long *v)
{
	if (ik_parse_int(s, min, max, v) < 0) {
		ik_warnx("%s: \"%s\" is not an integer in %lld..%lld", opt, s, min, max);
		return -1;
	}
	return 0;
}

int
ik_finish(int code)
{
	if (fflush(stdout) == EOF || ferror(stdout)) {
		ik_warnx("stdout: %s", strerror(errno ? errno : EIO));
		return code ? code : IK_SOFTWARE;
	}
	return code;
}
