/* pool.h: lines handed to a few forked workers that each live for many
 * lines (idemp-run --each).
 *
 * A process per line would pay, per line, what a worker pays once: its
 * store's connection (a PostgreSQL backend forked by the server, a TLS
 * handshake, an HTTP connection) and its client library's loading.  So at
 * most `jobs` workers are forked, on demand; each reads its lines from a
 * pipe of its own and answers each with one byte, the line's exit code,
 * on another, and ends at the end of its pipe.  A worker that dies answers
 * its line with its exit status (IK_SOFTWARE when a signal ended it), and
 * the next line goes to a new one.  A stop signal (ik_stop_signal) is
 * passed on to every worker once; the pool then takes no more lines and
 * waits for the answers of those given.  Single-threaded, like the
 * commands. */
#ifndef IK_POOL_H
#define IK_POOL_H

#include <sys/types.h>

#define IK_POOL_MAX 256   /* workers at most */

struct ik_pool_worker {
	pid_t pid;      /* 0: no worker in this slot */
	int in, out;    /* the parent's ends: its lines, its answers */
	int busy;       /* a line given, its answer not yet read */
};

struct ik_pool {
	long long jobs;
	struct ik_pool_worker *w;
	/* In a worker: one line, its exit code (0-255). */
	int (*work)(void *arg, char *line);
	/* In a worker, before it exits: what work kept (a store). */
	void (*end)(void *arg);
	/* In the parent: a line's exit code, in the order they end. */
	void (*done)(void *arg, int code);
	void *arg;
	int forwarded;
};

/* jobs in [1, IK_POOL_MAX].  0, or -1 with errno (ENOMEM). */
int ik_pool_init(struct ik_pool *p, long long jobs);
/* Gives line to a free worker, first waiting for one (answers read
 * meanwhile go to done).  IK_OK; IK_TEMPFAIL when no worker could be
 * started (the line is not run: the caller counts it); -1 when a stop
 * signal came first (the line is not run). */
int ik_pool_give(struct ik_pool *p, const char *line);
/* Waits for every answer, ends the workers, frees the pool. */
void ik_pool_end(struct ik_pool *p);

#endif
