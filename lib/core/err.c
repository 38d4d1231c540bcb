/* err.c: filling ik_err; see err.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/err.h"

static void
mark_truncated(ik_err *e, int n)
{
	if (n >= (int)sizeof e->msg)
		memcpy(e->msg + sizeof e->msg - 4, "...", 4);
}

int
ik_errf(ik_err *e, int code, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!e)
		return code;
	e->code = code;
	va_start(ap, fmt);
	n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	mark_truncated(e, n);
	return code;
}

int
ik_errwrap(ik_err *e, const char *fmt, ...)
{
	char prefix[512], old[sizeof e->msg];
	va_list ap;
	int n;

	if (!e)
		return 0;
	memcpy(old, e->msg, sizeof old);
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	n = snprintf(e->msg, sizeof e->msg, "%s: %s", prefix, old);
	mark_truncated(e, n);
	return e->code;
}

void
ik_errclear(ik_err *e)
{
	if (e) {
		e->code = 0;
		e->msg[0] = '\0';
	}
}
