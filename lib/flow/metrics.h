/* metrics.h: the Prometheus text exposition file of one run, for
 * node_exporter's textfile collector (idemkit-metrics, called by
 * charge-worker and charge-recover --metrics FILE).
 *
 * Rules: the file is replaced atomically (a temporary file in the same
 * directory, fsync, rename, fsync of the directory), so the collector never
 * reads half a file; the counters add this run's counts to the previous
 * file's, and the last-success time is carried over from it, so a failed
 * run keeps it; every sample carries idemkit_job="JOB", so the files of
 * several jobs in one collector directory never repeat a series. */
#ifndef IK_METRICS_H
#define IK_METRICS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/err.h"
#include "queue/queue.h"
#include "store/store.h"

struct ik_metrics_run {
	const char *job;            /* "worker", "recover-renotify", ... [a-z0-9_-] */
	const cJSON *summary;       /* the run's {"summary":true,...} line */
	int exit_status;            /* 0 and 1 (nothing to do) are a success */
	int64_t start_ms, end_ms;   /* epoch ms */
	const struct ik_store_stats *stats;   /* NULL: the store could not say */
	const struct ik_qstats *dlq;          /* NULL: no DLQ counts */
};

/* The exposition text of r, given the previous file's text (may be NULL),
 * malloc'd; NULL on ENOMEM or a summary that is not a worker's or a
 * recovery job's (IK_DATAERR in err). */
char *ik_metrics_format(const struct ik_metrics_run *r, const char *prev, ik_err *err);

/* Formats r against the file now at path and replaces it atomically.
 * IK_OK; IK_DATAERR (the summary); IK_CONFIG (the directory cannot be
 * written); IK_TEMPFAIL (a full disk, an I/O error). */
int ik_metrics_write(const char *path, const struct ik_metrics_run *r, ik_err *err);

/* The outbox relay's file (idemp-outbox --metrics, idemkit_job="outbox"):
 * the lag gauge, the published counter, the last good round, the lease. */
struct ik_metrics_outbox {
	const struct ik_outbox_stats *st;  /* NULL: the store could not say */
	int64_t published;    /* checkpointed since the last write: added to the counter */
	int64_t last_ok_ms;   /* epoch ms of the last successful round; 0: none since
	                       * the last write (the previous file's is kept) */
	int lease_held;       /* the relay holds the outbox lease now */
};

char *ik_metrics_format_outbox(const struct ik_metrics_outbox *o, const char *prev,
    ik_err *err);
/* Formats o against the file now at path and replaces it atomically, as
 * ik_metrics_write does and with its codes (but IK_DATAERR). */
int ik_metrics_write_outbox(const char *path, const struct ik_metrics_outbox *o, ik_err *err);

#endif
