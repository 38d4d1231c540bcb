/* proc.h: what every process of idemkit says and checks the same way,
 * the commands (cli.h) and the library below them alike: the error line,
 * an option's value checked with one, stdout flushed at the end. */
#ifndef IK_PROC_H
#define IK_PROC_H

#include <stdint.h>

/* "PROG: msg" on stderr. */
void ik_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "PROG: KEY: msg" on stderr, KEY (a chargeId or key from outside: an
 * argument, a line) as it is when all of it is the chargeId alphabet
 * ([A-Za-z0-9._:-]), else as a JSON string, quoted and escaped, so that
 * one with a space, a colon's look-alike, a quote or a control character
 * reads unambiguously: "a b": no record. */
void ik_warnk(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An option's duration (util.h forms: 500ms, 30s, 5m) within [min_ms,
 * max_ms] (INT64_MAX: no upper bound); 0, or -1 after a one-line complaint naming the option. */
int ik_opt_duration(const char *opt, const char *s, int64_t min_ms, int64_t max_ms,
    int64_t *ms);

/* An option's integer (base 10, nothing after it) within [min, max]; 0,
 * or -1 after a one-line complaint naming the option. */
int ik_opt_int(const char *opt, const char *s, long long min, long long max,
    long long *v);

/* Flush and check stdout (sbase fshut): returns code, or IK_SOFTWARE when
 * stdout could not be written (closed pipe, full disk). */
int ik_finish(int code);

#endif
