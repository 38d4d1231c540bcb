/* lines.h: reading lines from a file descriptor with a "would the next
 * read block?" question, which stdio cannot answer.  Batching commands
 * (sqs-ack --stream) use it to flush a partial batch as soon as their
 * input goes quiet, so batching never adds latency. */
#ifndef IK_LINES_H
#define IK_LINES_H

#include <stddef.h>

struct ik_lines {
	int fd;
	char *buf;
	size_t start, len, cap;   /* unread bytes are buf[start .. start+len) */
	int eof;
};

void ik_lines_init(struct ik_lines *r, int fd);
void ik_lines_free(struct ik_lines *r);

/* The next line without its newline (a last line without one counts),
 * NUL-terminated, valid until the next call.  Returns 1 on a line, 0 at
 * EOF, -1 on a read error with errno (EINTR when a signal came). */
int ik_lines_next(struct ik_lines *r, char **line, size_t *len);

/* 1 when ik_lines_next would return without waiting: a whole line is
 * buffered, the input has data, or it is at EOF; else 0. */
int ik_lines_ready(struct ik_lines *r);

#endif
