/* cli.c: the parts of main that every command shares; see cli.h. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/lines.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"

static void
on_signal(int sig)
{
	ik_stop_signal = sig;
}

/* A stop signal ignored on entry stays ignored: the shell's rule for
 * background jobs and nohup's for SIGHUP.  charge-worker starts the steps
 * after the receiver so, and a signal to the whole process group then
 * stops the receiver alone while the rest finish what it received
 * (charge-worker(1) "SIGNALS"). */
static void
stop_on(int sig, const struct sigaction *sa)
{
	struct sigaction old;

	if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
		return;
	sigaction(sig, sa, NULL);
}

void
ik_cli_init(const char *argv0)
{
	struct sigaction sa;

	ik_log_init(argv0);
	signal(SIGPIPE, SIG_IGN);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0;   /* no SA_RESTART: a blocking read returns EINTR */
	stop_on(SIGTERM, &sa);
	stop_on(SIGINT, &sa);
	stop_on(SIGHUP, &sa);
}

int
ik_fail(const ik_err *e)
{
	ik_warnx("%s", e->msg[0] ? e->msg : ik_code_name(e->code));
	return e->code;
}

int
ik_usage(const char *usage)
{
	fprintf(stderr, "%s", usage);
	fprintf(stderr, "Try '%s --help' for more information.\n", ik_prog());
	return IK_USAGE;
}

/* Weak: a command that opens no store does not link open_store.c (and its
 * adapters) for its help; one that has an @STORES@ in its help does. */
extern char *ik_store_forms(void) __attribute__((weak));

/* The options text with each @STORES@ replaced by the store URL forms of
 * lib/open/open_store.c's table (one fact, one place), wrapped at 79
 * columns under the column where it stood. */
static void
print_options(const char *options)
{
	static const char mark[] = "@STORES@";
	const char *s = options, *p, *bol;
	char *forms;
	size_t indent, col, len;

	while ((p = strstr(s, mark))) {
		fwrite(s, 1, (size_t)(p - s), stdout);
		for (bol = p; bol > options && bol[-1] != '\n'; bol--)
			;
		indent = col = (size_t)(p - bol);
		forms = ik_store_forms ? ik_store_forms() : NULL;
		for (const char *w = forms ? forms : "sqlite:PATH"; *w; w += len + (w[len] == ' ')) {
			len = strcspn(w, " ");
			if (col > indent && col + 1 + len > 79) {
				printf("\n%*s", (int)indent, "");
				col = indent;
			} else if (col > indent) {
				putchar(' ');
				col++;
			}
			fwrite(w, 1, len, stdout);
			col += len;
		}
		free(forms);
		s = p + sizeof mark - 1;
	}
	fputs(s, stdout);
}

int
ik_help(const char *usage, const char *options, const struct ik_exit *codes)
{
	printf("%s", usage);
	if (options && *options) {
		printf("\nOptions:\n");
		print_options(options);
	}
	printf("\nExit status:\n");
	for (; codes->code >= 0; codes++) {
		const char *m = codes->meaning, *nl;

		printf("  %3d  %-17s ", codes->code, ik_code_name(codes->code));
		for (; (nl = strchr(m, '\n')); m = nl + 1)
			printf("%.*s\n%25s", (int)(nl - m), m, "");
		printf("%s\n", m);
	}
	printf("\nSee %s(1) and idemkit(7).\n", ik_prog());
	return ik_finish(IK_OK);
}

int
ik_version(void)
{
	printf("%s (idemkit) %s\n", ik_prog(), IK_VERSION);
	return ik_finish(IK_OK);
}

int
ik_keys_check(int n, char **keys)
{
	for (int i = 0; i < n; i++)
		if (!*keys[i]) {
			ik_warnx("empty chargeId (argument %d)", i + 1);
			return IK_USAGE;
		}
	return IK_OK;
}

static int
each_stdin_key(struct ik_lines *in, int (*fn)(const char *, void *), void *ctx)
{
	char *line;
	size_t len;
	int r, rc = IK_OK;

	while ((r = ik_lines_next(in, &line, &len)) != 0) {
		if (r < 0) {
			if (errno == EINTR && !ik_stop_signal)
				continue;
			ik_warnx("stdin: %s", strerror(errno));
			return IK_SOFTWARE;
		}
		if (len && (r = fn(line, ctx)) > rc)
			rc = r;
	}
	return rc;
}

int
ik_each_key(int n, char **keys, int (*fn)(const char *, void *), void *ctx)
{
	struct ik_lines in;
	int r, rc = IK_OK;

	ik_lines_init(&in, STDIN_FILENO);
	if (n == 0)
		rc = each_stdin_key(&in, fn, ctx);
	for (int i = 0; i < n; i++) {
		r = strcmp(keys[i], "-") ? fn(keys[i], ctx) : each_stdin_key(&in, fn, ctx);
		if (r > rc)
			rc = r;
	}
	ik_lines_free(&in);
	return rc;
}
