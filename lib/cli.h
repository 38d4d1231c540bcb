/* cli.h: what every command does the same way: --help with its exit codes,
 * --version, the error line format, flushing stdout at exit, signals. */
#ifndef IK_CLI_H
#define IK_CLI_H

#include <signal.h>
#include <stdint.h>

#include "err.h"

/* Call first in main: sets the program name for errors and logs, ignores
 * SIGPIPE, installs the SIGTERM/SIGINT/SIGHUP flag handler. */
void ik_cli_init(const char *argv0);

/* "PROG: msg" on stderr. */
void ik_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "PROG: err->msg" and returns err->code (for `return ik_fail(&e)`). */
int ik_fail(const ik_err *e);

/* usage: USAGE line(s) on stderr, returns IK_USAGE. */
int ik_usage(const char *usage);
/* --help: the usage, the options text, then the exit codes the command can
 * return (from the table in outcome.c), on stdout; returns 0. */
int ik_help(const char *usage, const char *options, const int *codes);
int ik_version(void);

/* An option's duration (util.h forms: 500ms, 30s, 5m) within [min_ms,
 * max_ms] (INT64_MAX: no upper bound); 0, or -1 after a one-line complaint naming the option. */
int ik_opt_duration(const char *opt, const char *s, int64_t min_ms, int64_t max_ms,
    int64_t *ms);

/* An option's integer (base 10, nothing after it) within [min, max]; 0,
 * or -1 after a one-line complaint naming the option. */
int ik_opt_int(const char *opt, const char *s, long long min, long long max,
    long long *v);

/* The keys (chargeIds) a command works on, STYLE rule 7: the n arguments
 * when given, else stdin one per line, blank lines skipped; an argument
 * "-" reads stdin in its place.  ik_keys_check refuses an empty argument
 * (IK_USAGE after saying so; call it before opening anything), else
 * IK_OK.  ik_each_key calls fn on each key in order and returns the
 * largest code fn returned, or IK_SOFTWARE when stdin could not be read
 * (after saying why). */
int ik_keys_check(int n, char **keys);
int ik_each_key(int n, char **keys, int (*fn)(const char *key, void *ctx), void *ctx);

/* Flush and check stdout (sbase fshut): returns code, or IK_SOFTWARE when
 * stdout could not be written (closed pipe, full disk). */
int ik_finish(int code);

/* Set by the signal handler: the signal number that asked us to stop. */
extern volatile sig_atomic_t ik_stop_signal;

#endif
