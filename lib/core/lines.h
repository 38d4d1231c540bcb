/* lines.h: the one line reader (STYLE rule 7: records one per line).
 *
 * Reads a file descriptor into its own buffer, not stdio, so "would the
 * next read block?" has an answer: the stream loop (step.c) takes the
 * lines already there as one group and flushes before it waits.  A line
 * is returned without its newline and without a CR before it; a last line
 * without a newline counts; lines have no length limit (the buffer grows).
 * The buffer is wiped when freed: the lines may be credentials (aws_ini.c).
 */
#ifndef IK_LINES_H
#define IK_LINES_H

#include <stddef.h>

struct ik_lines {
	int fd;
	char *buf;
	size_t start, len, cap;   /* unread bytes are buf[start .. start+len) */
	size_t lines;             /* whole lines among them (a last one at EOF too) */
	int eof;
};

void ik_lines_init(struct ik_lines *r, int fd);
void ik_lines_free(struct ik_lines *r);

/* The next line, NUL-terminated, valid until the next call.  Blocks until
 * a line or EOF.  Returns 1 on a line, 0 at EOF, -1 on a read error with
 * errno (EINTR when a signal came: the caller checks ik_stop_signal and
 * calls again). */
int ik_lines_next(struct ik_lines *r, char **line, size_t *len);

/* For a caller that holds several lines at once (a group): fill reads
 * once (blocking unless ik_lines_ready said so), 0 or -1 with errno, and
 * may move the buffer; take returns the next line already buffered, or
 * NULL, and never reads, so the lines taken since the last fill stay
 * valid until the next one. */
int ik_lines_fill(struct ik_lines *r);
char *ik_lines_take(struct ik_lines *r, size_t *len);

/* 1 when fill would not wait: the input has data, or hung up; else 0. */
int ik_lines_ready(const struct ik_lines *r);
/* The same after waiting at most ms milliseconds for it: 0 when they
 * passed first, or a signal came. */
int ik_lines_wait(const struct ik_lines *r, int ms);

#endif
