/* metrics.c: the Prometheus text exposition file of one run (metrics.h).
 * The format is version 0.0.4 of the text format: "# HELP" and "# TYPE"
 * once per family, then "name{labels} value" lines, LF at the end of each.
 * Only our own strings go into labels (the job name is checked by the
 * command, outcome names come from the summary's keys we know). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/outcome.h"
#include "flow/metrics.h"

struct buf {
	char *p;
	size_t len, cap;
	int oom;
};

static void __attribute__((format(printf, 2, 3)))
put(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;
	char *t;

	for (;;) {
		if (b->oom)
			return;
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = 1;
			return;
		}
		if (b->p && b->len + (size_t)n < b->cap) {
			b->len += (size_t)n;
			return;
		}
		b->cap = (b->cap + (size_t)n + 1) * 2;
		if (!(t = realloc(b->p, b->cap))) {
			b->oom = 1;
			return;
		}
		b->p = t;
	}
}

/* The value of the sample "name{labels}" exactly as we write it, in the
 * previous file's text; 0 when absent or unreadable. */
static double
prev_value(const char *prev, const char *sample)
{
	size_t n = strlen(sample);
	const char *p = prev;

	while (p && *p) {
		if (strncmp(p, sample, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	return 0;
}

static int64_t
num(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);

	return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : 0;
}

static void
family(struct buf *b, const char *name, const char *type, const char *help)
{
	put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A counter sample: the previous file's value plus add. */
static void
counter(struct buf *b, const char *prev, const char *name, const char *labels, int64_t add)
{
	char sample[512];

	snprintf(sample, sizeof sample, "%s{%s}", name, labels);
	put(b, "%s %.0f\n", sample, prev_value(prev, sample) + (double)add);
}

/* The worker's outcomes: every message received has exactly one; the
 * summary key and the label.  "left" is every receive none of the others
 * counts (TEMPFAIL, LEASE_SHORT, an internal error, a failed ack: the
 * message was left for a retry), so the samples add up to received
 * whatever charge-worker's summary counts apart. */
static const char *const worker_outcomes[][2] = {
	{ "debited", "debited" },
	{ "debitedNotificationFailed", "debited_notification_failed" },
	{ "declined", "declined" },
	{ "dupDone", "dup_done" },
	{ "dupInProgress", "dup_in_progress" },
	{ "dupFailed", "dup_failed" },
	{ "payloadMismatch", "payload_mismatch" },
	{ "invalid", "invalid" },
	{ "staleEvent", "stale_event" },
	{ "leaseLost", "lease_lost" },
	{ "config", "config" },
	{ "left", "left" },
};

static void
worker_counts(struct buf *b, const struct ik_metrics_run *r, const char *prev)
{
	const cJSON *s = r->summary;
	char labels[160];
	int64_t v, named = 0;
	size_t i, n = sizeof worker_outcomes / sizeof worker_outcomes[0];

	family(b, "idemkit_worker_received_total", "counter", "Messages received.");
	snprintf(labels, sizeof labels, "idemkit_job=\"%s\"", r->job);
	counter(b, prev, "idemkit_worker_received_total", labels, num(s, "received"));
	family(b, "idemkit_worker_messages_total", "counter",
	       "Messages received, by what became of them; they add up to received.");
	for (i = 0; i + 1 < n; i++)
		named += num(s, worker_outcomes[i][0]) > 0 ? num(s, worker_outcomes[i][0]) : 0;
	for (i = 0; i < n; i++) {
		if (i + 1 == n)
			v = num(s, "received") - named;
		else
			v = num(s, worker_outcomes[i][0]);
		snprintf(labels, sizeof labels, "idemkit_job=\"%s\",outcome=\"%s\"", r->job,
		         worker_outcomes[i][1]);
		counter(b, prev, "idemkit_worker_messages_total", labels, v > 0 ? v : 0);
	}
	family(b, "idemkit_worker_ack_failed_total", "counter",
	       "Messages whose delete, DLQ move or visibility change failed (left).");
	snprintf(labels, sizeof labels, "idemkit_job=\"%s\"", r->job);
	counter(b, prev, "idemkit_worker_ack_failed_total", labels, num(s, "ackFailed"));
	family(b, "idemkit_worker_stranded_total", "counter",
	       "Messages received that no sqs-ack saw: a step died holding them (left).");
	counter(b, prev, "idemkit_worker_stranded_total", labels, num(s, "stranded"));
	family(b, "idemkit_worker_bank_replays_total", "counter",
	       "Debits the bank answered as a replay of an earlier one (a crash window was hit).");
	counter(b, prev, "idemkit_worker_bank_replays_total", labels, num(s, "bankReplays"));
}

/* A recovery job: "found", then every other count of its summary. */
static void
recover_counts(struct buf *b, const struct ik_metrics_run *r, const char *prev)
{
	const cJSON *it;
	char labels[256];

	family(b, "idemkit_recover_found_total", "counter", "Records or DLQ messages found to recover.");
	snprintf(labels, sizeof labels, "idemkit_job=\"%s\"", r->job);
	counter(b, prev, "idemkit_recover_found_total", labels, num(r->summary, "found"));
	family(b, "idemkit_recover_records_total", "counter",
	       "What the recovery did with what it found, by outcome.");
	cJSON_ArrayForEach(it, r->summary) {
		if (!cJSON_IsNumber(it) || strcmp(it->string, "found") == 0 ||
		    strspn(it->string, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") !=
		    strlen(it->string) || strlen(it->string) > 64)
			continue;
		snprintf(labels, sizeof labels, "idemkit_job=\"%s\",outcome=\"%s\"", r->job, it->string);
		counter(b, prev, "idemkit_recover_records_total", labels, (int64_t)it->valuedouble);
	}
}

static void
gauge(struct buf *b, const char *name, const char *help, const char *job, const char *extra,
      double v)
{
	if (help)
		family(b, name, "gauge", help);
	/* whole numbers as such, times and durations to the millisecond */
	put(b, v == (double)(int64_t)v ? "%s{idemkit_job=\"%s\"%s%s} %.0f\n"
	                               : "%s{idemkit_job=\"%s\"%s%s} %.3f\n",
	    name, job, extra ? "," : "", extra ? extra : "", v);
}

char *
ik_metrics_format(const struct ik_metrics_run *r, const char *prev, ik_err *err)
{
	struct buf b = { 0 };
	const struct ik_store_stats *st = r->stats;
	const cJSON *summary = cJSON_GetObjectItemCaseSensitive(r->summary, "summary");
	const char *j = r->job;
	char sample[160];
	double last_ok;
	int ok = r->exit_status == IK_OK || r->exit_status == IK_EMPTY;

	if (!cJSON_IsObject(r->summary) || !cJSON_IsTrue(summary)) {
		ik_errf(err, IK_DATAERR, "the summary is not a {\"summary\":true,...} object");
		return NULL;
	}
	if (cJSON_GetObjectItemCaseSensitive(r->summary, "received"))
		worker_counts(&b, r, prev);
	else if (cJSON_GetObjectItemCaseSensitive(r->summary, "found"))
		recover_counts(&b, r, prev);
	else {
		ik_errf(err, IK_DATAERR, "the summary has neither \"received\" (charge-worker) "
		        "nor \"found\" (charge-recover)");
		return NULL;
	}
	gauge(&b, "idemkit_run_duration_seconds", "How long the last run took.", j, NULL,
	      (double)(r->end_ms - r->start_ms) / 1000);
	gauge(&b, "idemkit_run_exit_status", "The last run's exit status (idemkit(7)).", j, NULL,
	      r->exit_status);
	gauge(&b, "idemkit_last_run_end_timestamp_seconds", "When the last run ended.", j, NULL,
	      (double)r->end_ms / 1000);
	snprintf(sample, sizeof sample, "idemkit_last_success_timestamp_seconds{idemkit_job=\"%s\"}", j);
	last_ok = ok ? (double)r->end_ms / 1000 : prev_value(prev, sample);
	gauge(&b, "idemkit_last_success_timestamp_seconds",
	      "When a run last ended with status 0 or 1 (0: never); kept across failed runs.",
	      j, NULL, last_ok);
	gauge(&b, "idemkit_store_stats_up", "1 when the store's counts below are from this run.",
	      j, NULL, st != NULL);
	if (st) {
		family(&b, "idemkit_records", "gauge", "Idempotency records by state (DONE may be "
		       "an estimate, see idemp-stats(1)).");
		gauge(&b, "idemkit_records", NULL, j, "state=\"IN_PROGRESS\"", (double)st->in_progress);
		gauge(&b, "idemkit_records", NULL, j, "state=\"DONE\"", (double)st->done);
		gauge(&b, "idemkit_records", NULL, j, "state=\"FAILED\"", (double)st->failed);
		gauge(&b, "idemkit_records", NULL, j, "state=\"DEBITED_NOTIFICATION_FAILED\"",
		      (double)st->dnf);
		gauge(&b, "idemkit_stuck_records", "IN_PROGRESS records whose lease has ended.", j,
		      NULL, (double)st->stuck);
		gauge(&b, "idemkit_oldest_stuck_age_seconds", "Age of the oldest stuck record (0: none).",
		      j, NULL, (double)st->oldest_stuck_ms / 1000);
		gauge(&b, "idemkit_dnf_backlog", "DEBITED_NOTIFICATION_FAILED records to re-notify.",
		      j, NULL, (double)st->dnf);
		gauge(&b, "idemkit_oldest_dnf_age_seconds", "Age of the oldest DNF record (0: none).",
		      j, NULL, (double)st->oldest_dnf_ms / 1000);
	}
	gauge(&b, "idemkit_dlq_up", "1 when the DLQ counts below are from this run.", j, NULL,
	      r->dlq != NULL);
	if (r->dlq) {
		family(&b, "idemkit_dlq_messages", "gauge",
		       "Messages in the dead-letter queue (approximate on SQS).");
		gauge(&b, "idemkit_dlq_messages", NULL, j, "kind=\"visible\"", (double)r->dlq->visible);
		gauge(&b, "idemkit_dlq_messages", NULL, j, "kind=\"inflight\"", (double)r->dlq->inflight);
		gauge(&b, "idemkit_dlq_messages", NULL, j, "kind=\"delayed\"", (double)r->dlq->delayed);
	}
	if (b.oom) {
		free(b.p);
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	return b.p;
}

/* The previous file, whole, or NULL (absent, unreadable or over 1 MiB:
 * then the counters start again, as after a restart). */
static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *p = NULL;
	size_t n = 0;
	long sz;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && sz < (1L << 20) &&
	    fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)sz + 1))) {
		n = fread(p, 1, (size_t)sz, f);
		p[n] = 0;
	}
	fclose(f);
	return p;
}

static int
io_err(ik_err *err, const char *what, const char *path)
{
	int e = errno;
	int code = e == ENOSPC || e == EIO || e == EDQUOT ? IK_TEMPFAIL : IK_CONFIG;

	return ik_errf(err, code, "metrics %s: %s: %s", path, what, strerror(e));
}

/* Replaces path with text, atomically (metrics.h); frees text. */
static int
replace(const char *path, char *text, ik_err *err)
{
	char *tmp = NULL, *dcopy = NULL;
	size_t len = strlen(text), off = 0;
	ssize_t w;
	int fd = -1, dfd, rc = IK_OK;

	/* The collector reads *.prom only: the temporary name ends otherwise. */
	if (!(tmp = malloc(strlen(path) + sizeof ".tmp.XXXXXX"))) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	strcpy(tmp, path);
	strcat(tmp, ".tmp.XXXXXX");
	if ((fd = mkstemp(tmp)) < 0) {
		rc = io_err(err, "create a temporary file", path);
		free(tmp);
		tmp = NULL;
		goto out;
	}
	/* node_exporter runs as another user; nothing here is secret. */
	if (fchmod(fd, 0644) < 0) {
		rc = io_err(err, "chmod", path);
		goto out;
	}
	while (off < len) {
		if ((w = write(fd, text + off, len - off)) < 0) {
			if (errno == EINTR)
				continue;
			rc = io_err(err, "write", path);
			goto out;
		}
		off += (size_t)w;
	}
	if (fsync(fd) < 0) {
		rc = io_err(err, "fsync", path);
		goto out;
	}
	if (close(fd) < 0) {
		fd = -1;
		rc = io_err(err, "close", path);
		goto out;
	}
	fd = -1;
	if (rename(tmp, path) < 0) {
		rc = io_err(err, "rename", path);
		goto out;
	}
	free(tmp);
	tmp = NULL;
	/* The rename itself is durable once the directory is. */
	if ((dcopy = strdup(path)) && (dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY)) >= 0) {
		fsync(dfd);
		close(dfd);
	}
out:
	if (fd >= 0)
		close(fd);
	if (tmp) {
		unlink(tmp);
		free(tmp);
	}
	free(dcopy);
	free(text);
	return rc;
}

int
ik_metrics_write(const char *path, const struct ik_metrics_run *r, ik_err *err)
{
	char *prev = slurp(path), *text;

	text = ik_metrics_format(r, prev, err);
	free(prev);
	return text ? replace(path, text, err) : err->code;
}

char *
ik_metrics_format_outbox(const struct ik_metrics_outbox *o, const char *prev, ik_err *err)
{
	static const char j[] = "outbox";
	struct buf b = { 0 };
	char sample[160];

	family(&b, "idemkit_outbox_published_total", "counter",
	       "Outbox events this host's relay published and checkpointed.");
	counter(&b, prev, "idemkit_outbox_published_total", "idemkit_job=\"outbox\"",
	        o->published);
	snprintf(sample, sizeof sample,
	         "idemkit_outbox_last_success_timestamp_seconds{idemkit_job=\"%s\"}", j);
	gauge(&b, "idemkit_outbox_last_success_timestamp_seconds",
	      "When the relay last ended a round without an error (0: never); kept across "
	      "failed rounds and runs.", j, NULL,
	      o->last_ok_ms ? (double)o->last_ok_ms / 1000 : prev_value(prev, sample));
	gauge(&b, "idemkit_outbox_lease_held", "1 while this relay holds the outbox lease "
	      "(one relay per store publishes).", j, NULL, o->lease_held != 0);
	gauge(&b, "idemkit_outbox_stats_up", "1 when the outbox counts below are from this "
	      "write.", j, NULL, o->st != NULL);
	if (o->st) {
		gauge(&b, "idemkit_outbox_waiting_events", "Outbox events written and not yet "
		      "published (checkpointed).", j, NULL, (double)o->st->waiting);
		gauge(&b, "idemkit_outbox_oldest_waiting_age_seconds", "Age of the oldest "
		      "waiting outbox event (0: none).", j, NULL, (double)o->st->oldest_ms / 1000);
	}
	if (b.oom) {
		free(b.p);
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	return b.p;
}

int
ik_metrics_write_outbox(const char *path, const struct ik_metrics_outbox *o, ik_err *err)
{
	char *prev = slurp(path), *text;

	text = ik_metrics_format_outbox(o, prev, err);
	free(prev);
	return text ? replace(path, text, err) : err->code;
}
