/* utf8.c: validating, cutting and repairing UTF-8; see utf8.h. */
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

#define REPL "\xef\xbf\xbd"   /* U+FFFD */

size_t
ik_utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t len;
	unsigned char lo = 0x80, hi = 0xbf;   /* the second byte's range */

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0;        /* overlong */
		else if (c == 0xed)
			hi = 0x9f;        /* surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;        /* overlong */
		else if (c == 0xf4)
			hi = 0x8f;        /* above U+10FFFF */
	} else
		return 0;
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return len;
}

int
ik_utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0, k; i < n; i += k)
		if (!(k = ik_utf8_seq(p + i, n - i)))
			return 0;
	return 1;
}

size_t
ik_utf8_copy(char *out, size_t outsz, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, o = 0, k;

	while (i < n) {
		const char *src = s + i;
		size_t w = k = ik_utf8_seq(p + i, n - i);
		if (!k) {
			src = REPL;
			w = sizeof REPL - 1;
			k = 1;
		}
		if (o + w >= outsz)
			break;
		memcpy(out + o, src, w);
		o += w;
		i += k;
	}
	out[o] = '\0';
	return o;
}

int
ik_utf8_clean(const char *s, const char **out, char **copy)
{
	size_t n, bad = 0, k, sz;

	*out = s;
	*copy = NULL;
	if (!s)
		return 0;
	n = strlen(s);
	for (size_t i = 0; i < n; i += k)
		if (!(k = ik_utf8_seq((const unsigned char *)s + i, n - i))) {
			bad++;
			k = 1;
		}
	if (!bad)
		return 0;
	sz = n + bad * (sizeof REPL - 2) + 1;
	if (!(*copy = malloc(sz)))
		return -1;
	ik_utf8_copy(*copy, sz, s, n);
	*out = *copy;
	return 0;
}
