/* log.c: one JSON object per line on stderr; see log.h.  Built with cJSON so
 * that any value, however odd, is escaped correctly. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "log.h"
#include "util.h"

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

static enum ik_level
threshold(void)
{
	const char *v = getenv("IDEMKIT_LOG");
	if (v && strcmp(v, "debug") == 0)
		return IK_LOG_DEBUG;
	if (v && (strcmp(v, "quiet") == 0 || strcmp(v, "warn") == 0))
		return IK_LOG_WARN;
	return IK_LOG_INFO;
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

void
ik_log(enum ik_level lvl, const char *msg, ...)
{
	va_list ap;
	cJSON *o;
	char *line;
	const char *k, *v;

	if (lvl != IK_LOG_AUDIT && lvl < threshold())
		return;
	if (!(o = cJSON_CreateObject()))
		return;
	cJSON_AddNumberToObject(o, "ts", (double)ik_now_ms());
	cJSON_AddStringToObject(o, "level", level_name(lvl));
	cJSON_AddStringToObject(o, "prog", prog);
	cJSON_AddStringToObject(o, "msg", msg);
	va_start(ap, msg);
	while ((k = va_arg(ap, const char *))) {
		if (k == ik_log_num_field) {
			const char *name = va_arg(ap, const char *);
			int64_t n = va_arg(ap, int64_t);
			if (name)
				cJSON_AddNumberToObject(o, name, (double)n);
			continue;
		}
		if ((v = va_arg(ap, const char *)))
			cJSON_AddStringToObject(o, k, v);
	}
	va_end(ap);
	if ((line = cJSON_PrintUnformatted(o))) {
		fprintf(stderr, "%s\n", line);
		fflush(stderr);
		free(line);
	}
	cJSON_Delete(o);
}
