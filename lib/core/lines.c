/* lines.c: see lines.h. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "core/lines.h"

#define CHUNK 65536

void
ik_lines_init(struct ik_lines *r, int fd)
{
	memset(r, 0, sizeof *r);
	r->fd = fd;
}

void
ik_lines_free(struct ik_lines *r)
{
	if (r->buf)
		sodium_memzero(r->buf, r->cap);
	free(r->buf);
	memset(r, 0, sizeof *r);
	r->fd = -1;
}

int
ik_lines_fill(struct ik_lines *r)
{
	ssize_t n;

	if (r->eof)
		return 0;
	if (r->start > 0) {   /* the unread part to the front */
		memmove(r->buf, r->buf + r->start, r->len);
		r->start = 0;
	}
	if (r->cap - r->len < CHUNK / 4 + 1) {
		size_t cap = r->cap ? r->cap * 2 : CHUNK;
		char *p;
		if (cap < r->cap || !(p = realloc(r->buf, cap)))
			return errno = ENOMEM, -1;
		r->buf = p;
		r->cap = cap;
	}
	/* one byte stays spare: take terminates a last line there */
	n = read(r->fd, r->buf + r->len, r->cap - r->len - 1);
	if (n < 0)
		return -1;
	if (n == 0) {
		r->eof = 1;
		if (r->len && r->buf[r->len - 1] != '\n')
			r->lines++;
		return 0;
	}
	for (char *q = r->buf + r->len, *e = q + n; (q = memchr(q, '\n', (size_t)(e - q))); q++)
		r->lines++;
	r->len += (size_t)n;
	return 0;
}

char *
ik_lines_take(struct ik_lines *r, size_t *len)
{
	char *b, *nl;
	size_t l;

	if (!r->lines)
		return NULL;
	b = r->buf + r->start;
	nl = memchr(b, '\n', r->len);
	l = nl ? (size_t)(nl - b) : r->len;   /* no newline: the last line, at EOF */
	b[l] = '\0';                          /* the '\n', or the spare byte */
	r->start += nl ? l + 1 : l;
	r->len -= nl ? l + 1 : l;
	r->lines--;
	if (l && b[l - 1] == '\r')
		b[--l] = '\0';
	*len = l;
	return b;
}

int
ik_lines_next(struct ik_lines *r, char **line, size_t *len)
{
	while (!(*line = ik_lines_take(r, len))) {
		if (r->eof)
			return 0;
		if (ik_lines_fill(r) < 0)
			return -1;
	}
	return 1;
}

int
ik_lines_wait(const struct ik_lines *r, int ms)
{
	struct pollfd p = { .fd = r->fd, .events = POLLIN };

	return poll(&p, 1, ms) > 0 && (p.revents & (POLLIN | POLLHUP));
}

int
ik_lines_ready(const struct ik_lines *r)
{
	return ik_lines_wait(r, 0);
}
