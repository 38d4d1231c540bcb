/* pool.c: lines handed to long-lived forked workers; see pool.h. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/lines.h"
#include "core/outcome.h"
#include "core/pool.h"
#include "core/util.h"

int
ik_pool_init(struct ik_pool *p, long long jobs)
{
	p->jobs = jobs;
	p->forwarded = 0;
	return (p->w = calloc((size_t)jobs, sizeof *p->w)) ? 0 : -1;
}

/* In the worker: its lines until their end or a stop signal; never returns. */
static void
worker(struct ik_pool *p, int in, int out)
{
	struct ik_lines l;
	char *line;
	size_t len;
	unsigned char c;
	int r;

	ik_lines_init(&l, in);
	while (!ik_stop_signal) {
		if ((r = ik_lines_next(&l, &line, &len)) < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		c = (unsigned char)p->work(p->arg, line);
		while ((r = (int)write(out, &c, 1)) < 0 && errno == EINTR)
			;
		if (r != 1)   /* the parent is gone: nobody would count the next */
			break;
	}
	if (p->end)
		p->end(p->arg);
	_exit(0);
}

static int
start(struct ik_pool *p, struct ik_pool_worker *w)
{
	int in[2], out[2];
	pid_t pid;

	if (ik_cloexec_pipe(in, 0) < 0)
		return -1;
	if (ik_cloexec_pipe(out, 0) < 0) {
		close(in[0]);
		close(in[1]);
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	if ((pid = fork()) == 0) {
		/* The other workers' pipes: a worker holding another's line
		 * pipe open would keep that one from ever seeing its end. */
		for (long long i = 0; i < p->jobs; i++)
			if (p->w[i].pid > 0) {
				close(p->w[i].in);
				close(p->w[i].out);
			}
		close(in[1]);
		close(out[0]);
		worker(p, in[0], out[1]);
	}
	close(in[0]);
	close(out[1]);
	if (pid < 0) {
		close(in[1]);
		close(out[0]);
		return -1;
	}
	*w = (struct ik_pool_worker){ .pid = pid, .in = in[1], .out = out[0] };
	return 0;
}

/* The worker is gone or told to go: its pipes closed, its status. */
static int
reap(struct ik_pool_worker *w)
{
	int st = 0;

	close(w->in);
	close(w->out);
	while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR)
		;
	w->pid = 0;
	w->busy = 0;
	return st;
}

static void
forward(struct ik_pool *p)
{
	if (!ik_stop_signal || p->forwarded)
		return;
	p->forwarded = 1;
	for (long long i = 0; i < p->jobs; i++)
		if (p->w[i].pid > 0)
			kill(p->w[i].pid, ik_stop_signal);
}

/* Waits for at least one answer (or a signal), and passes on those come. */
static void
collect(struct ik_pool *p)
{
	struct pollfd fds[IK_POOL_MAX];
	long long at[IK_POOL_MAX];
	nfds_t n = 0;
	unsigned char c;
	ssize_t k;
	int st;

	for (long long i = 0; i < p->jobs && n < IK_POOL_MAX; i++)
		if (p->w[i].busy) {
			fds[n] = (struct pollfd){ .fd = p->w[i].out, .events = POLLIN };
			at[n++] = i;
		}
	if (!n || poll(fds, n, -1) <= 0)
		return;   /* none in flight, or a signal: the caller looks */
	for (nfds_t j = 0; j < n; j++) {
		struct ik_pool_worker *w = &p->w[at[j]];
		if (!fds[j].revents)
			continue;
		if ((k = read(w->out, &c, 1)) == 1) {
			w->busy = 0;
			p->done(p->arg, c);
		} else if (k == 0 || errno != EINTR) {
			/* died on its line: its status is the line's */
			st = reap(w);
			p->done(p->arg, WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : IK_SOFTWARE);
		}
	}
}

int
ik_pool_give(struct ik_pool *p, const char *line)
{
	struct ik_buf b = { 0 };
	struct ik_pool_worker *w;
	long long i;
	ssize_t k;
	int rc = -1;

	if (ik_buf_addstr(&b, line) < 0 || ik_buf_addstr(&b, "\n") < 0) {
		ik_buf_free(&b);
		return IK_SOFTWARE;
	}
	for (;;) {
		forward(p);
		if (ik_stop_signal)
			break;
		for (i = 0; i < p->jobs && (p->w[i].pid <= 0 || p->w[i].busy); i++)
			;
		if (i == p->jobs)   /* none idle: a slot without a worker? */
			for (i = 0; i < p->jobs && p->w[i].pid > 0; i++)
				;
		if (i == p->jobs) {   /* all busy */
			collect(p);
			continue;
		}
		w = &p->w[i];
		if (w->pid <= 0 && start(p, w) < 0) {
			rc = IK_TEMPFAIL;
			break;
		}
		/* an idle worker's pipe is empty, and a line of a key is far
		 * shorter than PIPE_BUF: one write, at once */
		while ((k = write(w->in, b.p, b.len)) < 0 && errno == EINTR)
			;
		if (k == (ssize_t)b.len) {
			w->busy = 1;
			rc = IK_OK;
			break;
		}
		reap(w);   /* died idle (EPIPE): the line goes to another */
	}
	ik_buf_free(&b);
	return rc;
}

void
ik_pool_end(struct ik_pool *p)
{
	for (;;) {
		long long busy = 0;
		forward(p);
		for (long long i = 0; i < p->jobs; i++)
			busy += p->w[i].busy;
		if (!busy)
			break;
		collect(p);
	}
	for (long long i = 0; i < p->jobs; i++)
		if (p->w[i].pid > 0)
			close(p->w[i].in);   /* its lines end: it exits */
	for (long long i = 0; i < p->jobs; i++)
		if (p->w[i].pid > 0) {
			p->w[i].in = -1;
			close(p->w[i].out);
			while (waitpid(p->w[i].pid, NULL, 0) < 0 && errno == EINTR)
				forward(p);
			p->w[i].pid = 0;
		}
	free(p->w);
	p->w = NULL;
}
