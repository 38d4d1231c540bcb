/* log.c: one JSON object per line on stderr; see log.h.  Strings are
 * escaped by json.c exactly as cJSON escapes them, so any value, however
 * odd, is written correctly. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/log.h"
#include "core/util.h"

static const char *prog = "idemkit";

const char ik_log_num_field[] = "(number)";

void
ik_log_init(const char *p)
{
	const char *slash = strrchr(p, '/');
	prog = slash ? slash + 1 : p;
}

const char *
ik_prog(void)
{
	return prog;
}

/* IDEMKIT_LOG, read once: the environment of a process does not change
 * under it, and a stream step logs per charge. */
static enum ik_level
threshold(void)
{
	static int cached = -1;
	const char *v;

	if (cached >= 0)
		return (enum ik_level)cached;
	v = getenv("IDEMKIT_LOG");
	if (v && strcmp(v, "debug") == 0)
		cached = IK_LOG_DEBUG;
	else if (v && (strcmp(v, "quiet") == 0 || strcmp(v, "warn") == 0))
		cached = IK_LOG_WARN;
	else
		cached = IK_LOG_INFO;
	return (enum ik_level)cached;
}

int
ik_log_enabled(enum ik_level lvl)
{
	return lvl == IK_LOG_AUDIT || lvl >= threshold();
}

static const char *
level_name(enum ik_level l)
{
	switch (l) {
	case IK_LOG_DEBUG: return "debug";
	case IK_LOG_INFO:  return "info";
	case IK_LOG_WARN:  return "warn";
	case IK_LOG_ERROR: return "error";
	case IK_LOG_AUDIT: return "audit";
	}
	return "info";
}

/* ,"key":  */
static void
put_key(struct ik_jbuf *b, const char *k)
{
	ik_jbuf_put(b, ",", 1);
	ik_jbuf_str(b, k);
	ik_jbuf_put(b, ":", 1);
}

/* The line is written straight into one buffer, in the bytes a cJSON
 * object of the same fields would print as (a NULL value, or a NULL msg,
 * leaves its field out as cJSON_AddStringToObject did), and goes out in
 * one write. */
void
ik_log(enum ik_level lvl, const char *msg, ...)
{
	/* Reused: a log line per charge.  Shared, so held under mu: bank-sim
	 * logs from a thread per connection and idemp-run from its renewer
	 * (unguarded, two threads grew it at once: the sanitizer build found
	 * one's allocation leaked, and a line torn by the other). */
	static struct ik_jbuf b;
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	va_list ap;
	const char *k, *v;

	if (lvl != IK_LOG_AUDIT && lvl < threshold())
		return;
	pthread_mutex_lock(&mu);
	b.len = 0;
	b.oom = 0;
	ik_jbuf_put(&b, "{\"ts\":", 6);
	ik_jbuf_num(&b, (double)ik_now_ms());
	put_key(&b, "level");
	ik_jbuf_str(&b, level_name(lvl));
	put_key(&b, "prog");
	ik_jbuf_str(&b, prog);
	if (msg) {
		put_key(&b, "msg");
		ik_jbuf_str(&b, msg);
	}
	va_start(ap, msg);
	while ((k = va_arg(ap, const char *))) {
		if (k == ik_log_num_field) {
			const char *name = va_arg(ap, const char *);
			int64_t n = va_arg(ap, int64_t);
			if (name) {
				put_key(&b, name);
				ik_jbuf_num(&b, (double)n);
			}
			continue;
		}
		if ((v = va_arg(ap, const char *))) {
			put_key(&b, k);
			ik_jbuf_str(&b, v);
		}
	}
	va_end(ap);
	ik_jbuf_put(&b, "}\n", 2);
	if (!b.oom) {
		fwrite(b.p, 1, b.len, stderr);
		fflush(stderr);
	}
	pthread_mutex_unlock(&mu);
}
