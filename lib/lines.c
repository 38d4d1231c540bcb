/* lines.c: see lines.h.  Lines have no length limit: the buffer grows. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lines.h"

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
	free(r->buf);
	memset(r, 0, sizeof *r);
}

int
ik_lines_next(struct ik_lines *r, char **line, size_t *len)
{
	size_t scanned = 0;

	for (;;) {
		char *nl = r->len > scanned ?
			memchr(r->buf + r->start + scanned, '\n', r->len - scanned) : NULL;
		ssize_t n;

		if (nl || (r->eof && r->len > 0)) {
			size_t l = nl ? (size_t)(nl - (r->buf + r->start)) : r->len;
			*line = r->buf + r->start;
			*len = l;
			(*line)[l] = '\0';   /* the '\n', or the spare byte kept below */
			r->start += nl ? l + 1 : l;
			r->len -= nl ? l + 1 : l;
			return 1;
		}
		if (r->eof)
			return 0;
		scanned = r->len;
		/* make room: move the unread part to the front, then grow */
		if (r->start > 0) {
			memmove(r->buf, r->buf + r->start, r->len);
			r->start = 0;
		}
		if (r->cap - r->len < CHUNK + 1) {
			size_t cap = r->cap ? r->cap * 2 : CHUNK * 2;
			char *p = realloc(r->buf, cap);
			if (!p)
				return errno = ENOMEM, -1;
			r->buf = p;
			r->cap = cap;
		}
		n = read(r->fd, r->buf + r->len, r->cap - r->len - 1);
		if (n < 0)
			return -1;
		if (n == 0)
			r->eof = 1;
		r->len += (size_t)n;
	}
}

int
ik_lines_ready(struct ik_lines *r)
{
	struct pollfd p = { .fd = r->fd, .events = POLLIN };

	if (r->eof || (r->len && memchr(r->buf + r->start, '\n', r->len)))
		return 1;
	return poll(&p, 1, 0) > 0;
}
