/* err.h: how library code reports failure.
 *
 * Library functions return an outcome code (outcome.h) and, when it is not
 * IK_OK, fill an ik_err with a one-line reason.  Only cmd/ prints it, prefixed
 * with the program name, and only cmd/ exits.  The message is ours, never
 * outside data verbatim without a bound: ik_errf truncates with a visible
 * ellipsis rather than silently.
 */
#ifndef IK_ERR_H
#define IK_ERR_H

typedef struct ik_err {
	int code;          /* an IK_* outcome code */
	char msg[1024];    /* one line, no trailing newline */
} ik_err;

/* Set e (may be NULL) and return code, so callers can `return ik_errf(...)`. */
int ik_errf(ik_err *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Prefix the message already in e with "fmt: ", keeping its code. */
int ik_errwrap(ik_err *e, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

void ik_errclear(ik_err *e);

#endif
