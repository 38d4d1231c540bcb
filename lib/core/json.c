/* json.c: cJSON trees printed without the %g round trip; see json.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

static int
grow(struct ik_jbuf *b, size_t n)
{
	size_t cap;
	char *p;

	if (b->oom)
		return -1;
	if (b->len + n + 1 <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 256;
	while (cap < b->len + n + 1)
		cap *= 2;
	if (!(p = realloc(b->p, cap))) {
		b->oom = 1;
		return -1;
	}
	b->p = p;
	b->cap = cap;
	return 0;
}

void
ik_jbuf_put(struct ik_jbuf *b, const char *s, size_t n)
{
	if (grow(b, n) < 0)
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void
ik_jbuf_str(struct ik_jbuf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *u = (const unsigned char *)(s ? s : "");
	size_t start;

	ik_jbuf_put(b, "\"", 1);
	for (;;) {
		/* the run that needs no escape, in one copy */
		for (start = 0; u[start] >= 32 && u[start] != '"' && u[start] != '\\'; start++)
			;
		ik_jbuf_put(b, (const char *)u, start);
		u += start;
		if (!*u)
			break;
		switch (*u) {
		case '"':  ik_jbuf_put(b, "\\\"", 2); break;
		case '\\': ik_jbuf_put(b, "\\\\", 2); break;
		case '\b': ik_jbuf_put(b, "\\b", 2); break;
		case '\f': ik_jbuf_put(b, "\\f", 2); break;
		case '\n': ik_jbuf_put(b, "\\n", 2); break;
		case '\r': ik_jbuf_put(b, "\\r", 2); break;
		case '\t': ik_jbuf_put(b, "\\t", 2); break;
		default: {
			char e[6] = { '\\', 'u', '0', '0', hex[*u >> 4], hex[*u & 15] };
			ik_jbuf_put(b, e, 6);
		}
		}
		u++;
	}
	ik_jbuf_put(b, "\"", 1);
}

void
ik_jbuf_num(struct ik_jbuf *b, double d)
{
	char digits[24], *p = digits + sizeof digits;
	unsigned long long v;
	cJSON *n;
	char *s;

	/* An integral value below 10^15 is its digits in both of cJSON's
	 * branches ("%d", or "%1.15g", which uses no exponent there); -0
	 * and the rest take cJSON's own way. */
	if (d > -1e15 && d < 1e15 && d == floor(d) && !(d == 0 && signbit(d))) {
		v = (unsigned long long)(d < 0 ? -d : d);
		do
			*--p = (char)('0' + v % 10);
		while ((v /= 10) != 0);
		if (d < 0)
			*--p = '-';
		ik_jbuf_put(b, p, (size_t)(digits + sizeof digits - p));
		return;
	}
	if (!(n = cJSON_CreateNumber(d)) || !(s = cJSON_PrintUnformatted(n))) {
		cJSON_Delete(n);
		b->oom = 1;
		return;
	}
	ik_jbuf_put(b, s, strlen(s));
	free(s);
	cJSON_Delete(n);
}

int
ik_jbuf_json(struct ik_jbuf *b, const cJSON *it)
{
	const cJSON *c;

	switch (it->type & 0xFF) {
	case cJSON_NULL:   ik_jbuf_put(b, "null", 4); return 0;
	case cJSON_False:  ik_jbuf_put(b, "false", 5); return 0;
	case cJSON_True:   ik_jbuf_put(b, "true", 4); return 0;
	case cJSON_Number: ik_jbuf_num(b, it->valuedouble); return 0;
	case cJSON_String: ik_jbuf_str(b, it->valuestring); return 0;
	case cJSON_Raw:
		if (!it->valuestring)
			return -1;
		ik_jbuf_put(b, it->valuestring, strlen(it->valuestring));
		return 0;
	case cJSON_Array:
		ik_jbuf_put(b, "[", 1);
		for (c = it->child; c; c = c->next) {
			if (ik_jbuf_json(b, c) < 0)
				return -1;
			if (c->next)
				ik_jbuf_put(b, ",", 1);
		}
		ik_jbuf_put(b, "]", 1);
		return 0;
	case cJSON_Object:
		ik_jbuf_put(b, "{", 1);
		for (c = it->child; c; c = c->next) {
			ik_jbuf_str(b, c->string);
			ik_jbuf_put(b, ":", 1);
			if (ik_jbuf_json(b, c) < 0)
				return -1;
			if (c->next)
				ik_jbuf_put(b, ",", 1);
		}
		ik_jbuf_put(b, "}", 1);
		return 0;
	}
	return -1;
}

char *
ik_json_print(const cJSON *item)
{
	struct ik_jbuf b = { 0 };

	if (!item || ik_jbuf_json(&b, item) < 0 || b.oom || grow(&b, 0) < 0) {
		free(b.p);
		return NULL;
	}
	return b.p;
}
