/* cli.h: what every command does the same way: --help with its exit codes,
 * --version, the error line, signals (what library code says and checks
 * the same way is proc.h's). */
#ifndef IK_CLI_H
#define IK_CLI_H

#include <signal.h>
#include <stdint.h>

#include "core/err.h"
#include "core/proc.h"

/* Call first in main: sets the program name for errors and logs, ignores
 * SIGPIPE, installs the SIGTERM/SIGINT/SIGHUP flag handler. */
void ik_cli_init(const char *argv0);

/* Prints "PROG: err->msg" and returns err->code (for `return ik_fail(&e)`). */
int ik_fail(const ik_err *e);

/* usage: USAGE line(s) on stderr, returns IK_USAGE. */
int ik_usage(const char *usage);
/* One exit code a command can return and what it means for that command
 * (its man page's EXIT STATUS, in a line or two of at most 55 characters,
 * "\n" between them); the code's name comes from outcome.c, the one
 * table.  A command's list ends with { -1, NULL }. */
struct ik_exit {
	int code;
	const char *meaning;
};
/* --help: the usage, the options text, then the exit codes the command can
 * return, each with its name and what it means for this command, on
 * stdout; returns 0. */
int ik_help(const char *usage, const char *options, const struct ik_exit *codes);
int ik_version(void);

/* The keys (chargeIds) a command works on, STYLE rule 7: the n arguments
 * when given, else stdin one per line, blank lines skipped; an argument
 * "-" reads stdin in its place.  ik_keys_check refuses an empty argument
 * (IK_USAGE after saying so; call it before opening anything), else
 * IK_OK.  ik_each_key calls fn on each key in order and returns the
 * largest code fn returned, or IK_SOFTWARE when stdin could not be read
 * (after saying why). */
int ik_keys_check(int n, char **keys);
int ik_each_key(int n, char **keys, int (*fn)(const char *key, void *ctx), void *ctx);

#endif
