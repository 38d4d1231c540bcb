/* store_dynamodb_stream.c: the outbox relay reads the table's own change
 * log, DynamoDB Streams (store_dynamodb.h, store_dynamodb_outbox.c).
 *
 * Rules: idemp-init, with $IDEMKIT_OUTBOX set, turns the table's stream on
 * (NEW_IMAGE).  The relay reads it where the endpoint serves it (DynamoDB,
 * DynamoDB Local; dynalite keeps no streams): each shard from its
 * checkpointed position, a parent shard to its end before its children,
 * as the Streams API documents; a record whose new image carries the
 * outbox index's key (obPend) names an item with an event waiting.  The
 * stream says where to look, the item says what waits: the relay reads
 * the items it names consistently (store_dynamodb_outbox.c), so an event
 * the stream shows again (a position not yet checkpointed, an event the
 * index sweep published) is not sent again once it was checkpointed.
 * The positions are the relay's checkpoint in the stream: kept on the
 * relay's lease item (obStream, the stream's ARN; obPos, shardId to the
 * last sequence number done, or "end"), written only under the lease and
 * only for records whose events are all checkpointed.
 * The outbox index stays the ledger of what waits: the relay sweeps it
 * when it takes the lease, every SWEEP_MS, and whenever the stream lost
 * something (records trimmed past the 24-hour retention while no relay
 * ran, an item read was throttled), so an event the stream does not show
 * (written before the stream was on, or trimmed) is published all the
 * same.  A sweep goes on until it finds no event older than its start
 * (what came since is in the stream), so a busy table does not keep the
 * relay on the index.  While the streams endpoint fails (down, a role
 * without dynamodb:GetRecords) the relay reads the index alone, for
 * BROKEN_MS at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws/aws.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"
#include "store/dynamodb/store_dynamodb.h"

#define STREAMS_PREFIX "DynamoDBStreams_20120810."
#define RECORDS_MAX 1000       /* GetRecords' most */
#define DESCRIBE_MS 30000      /* the shards are listed again after this */
#define SWEEP_MS 60000         /* the index is swept at least this often */
#define BROKEN_MS 60000        /* a failed stream is left alone this long */
#define POS_END "end"

struct shard {
	char *id, *parent;
	char *done;        /* last sequence number whose events are checkpointed */
	char *read;        /* last sequence number read (>= done) */
	char *saved;       /* what the lease item holds */
	char *iter;        /* where the next GetRecords reads */
	int ended;         /* read to its end (closed shard) */
	int listed;        /* in the last DescribeStream */
};

struct ddb_stream {
	struct ik_aws *aws;
	char *arn;             /* NULL: not known yet */
	int off;               /* no stream to read: the index only */
	int loaded;            /* positions read from the lease item */
	int sweep_due;
	int64_t sweep_from;    /* the wall clock a sweep began at, 0: none runs */
	int64_t swept_ms, described_ms, broken_until;
	struct shard *sh;
	size_t n;
};

static void
set_str(char **dst, const char *s)
{
	char *c = s ? strdup(s) : NULL;

	free(*dst);
	*dst = c;
}

static int
same(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

static void
shard_free(struct shard *s)
{
	free(s->id);
	free(s->parent);
	free(s->done);
	free(s->read);
	free(s->saved);
	free(s->iter);
}

static void
shards_clear(struct ddb_stream *s)
{
	for (size_t i = 0; i < s->n; i++)
		shard_free(&s->sh[i]);
	free(s->sh);
	s->sh = NULL;
	s->n = 0;
}

void
ddb_stream_free(struct ddb *d)
{
	struct ddb_stream *s = d->obs;

	if (!s)
		return;
	shards_clear(s);
	ik_aws_close(s->aws);
	free(s->arn);
	free(s);
	d->obs = NULL;
}

void
ddb_stream_rewind(struct ddb *d)
{
	struct ddb_stream *s = d->obs;

	for (size_t i = 0; s && i < s->n; i++)
		if (!same(s->sh[i].read, s->sh[i].done)) {
			set_str(&s->sh[i].read, s->sh[i].done);
			set_str(&s->sh[i].iter, NULL);
			s->sh[i].ended = 0;
		}
}

void
ddb_stream_reload(struct ddb *d)
{
	struct ddb_stream *s = d->obs;

	if (!s)
		return;
	shards_clear(s);
	s->loaded = 0;
	s->sweep_due = 1;
	s->described_ms = 0;
}

void
ddb_stream_drained(struct ddb *d)
{
	struct ddb_stream *s = d->obs;

	for (size_t i = 0; s && i < s->n; i++)
		set_str(&s->sh[i].done, s->sh[i].read);
}

static struct shard *
shard_find(struct ddb_stream *s, const char *id)
{
	for (size_t i = 0; id && i < s->n; i++)
		if (strcmp(s->sh[i].id, id) == 0)
			return &s->sh[i];
	return NULL;
}

static struct shard *
shard_add(struct ddb_stream *s, const char *id, ik_err *err)
{
	struct shard *t = realloc(s->sh, (s->n + 1) * sizeof *t);

	if (!t || !(id = strdup(id))) {
		if (t)
			s->sh = t;
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	s->sh = t;
	t = &s->sh[s->n++];
	memset(t, 0, sizeof *t);
	t->id = (char *)id;
	return t;
}

/* ---- where the stream is --------------------------------------------------- */

/* The table's stream, if the relay can read it (a new image to read the
 * outbox key from).  IK_OK, s->off set when there is none. */
static int
find_stream(struct ddb *d, struct ddb_stream *s, ik_err *err)
{
	cJSON *resp = NULL, *t, *spec;
	const char *arn, *view;
	int rc = ddb_describe(d, &resp, err);

	if (rc == IK_AWS_ERROR)
		rc = err->code ? err->code : IK_SOFTWARE;
	if (rc != IK_OK) {
		cJSON_Delete(resp);
		return rc;
	}
	t = cJSON_GetObjectItemCaseSensitive(resp, "Table");
	spec = cJSON_GetObjectItemCaseSensitive(t, "StreamSpecification");
	arn = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "LatestStreamArn"));
	view = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(spec, "StreamViewType"));
	if (!arn || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(spec, "StreamEnabled")) ||
	    !view || (strcmp(view, "NEW_IMAGE") != 0 && strcmp(view, "NEW_AND_OLD_IMAGES") != 0)) {
		s->off = 1;
		ik_log(IK_LOG_INFO, "outbox: the table has no stream with new images; the "
		       "relay reads the outbox index", "table", d->table,
		       "stream", arn ? view : "none", NULL);
	} else if (!(s->arn = strdup(arn))) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	cJSON_Delete(resp);
	return rc;
}

/* The positions on the lease item, for this stream only (another ARN: a
 * stream turned off and on again, read from its start). */
static int
load_positions(struct ddb *d, struct ddb_stream *s, ik_err *err)
{
	cJSON *r = ddb_get_req(d, DDB_RELAY_KEY), *resp = NULL, *item, *m, *p;
	struct shard *sh;
	int rc = ddb_call(d, "GetItem", r, NULL, &resp, err);

	cJSON_Delete(r);
	if (rc != IK_OK)
		return rc;
	item = cJSON_GetObjectItemCaseSensitive(resp, "Item");
	m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(item, "obPos"), "M");
	if (same(ddb_attr_s(item, "obStream"), s->arn))
		cJSON_ArrayForEach(p, m) {
			const char *v = ddb_attr_s(m, p->string);

			if (!v || !(sh = shard_add(s, p->string, err))) {
				if (!v)
					continue;
				rc = IK_SOFTWARE;
				break;
			}
			set_str(&sh->done, v);
			set_str(&sh->read, v);
			set_str(&sh->saved, v);
			sh->ended = strcmp(v, POS_END) == 0;
		}
	cJSON_Delete(resp);
	s->loaded = rc == IK_OK;
	return rc;
}

/* Streams API errors: the type, or "" (ik_aws_call's own codes). */
static int
streams_call(struct ddb_stream *s, const char *op, const cJSON *req, cJSON **resp,
             struct ik_aws_error *ae, ik_err *err)
{
	char target[64];

	snprintf(target, sizeof target, STREAMS_PREFIX "%s", op);
	memset(ae, 0, sizeof *ae);
	*resp = NULL;
	return ik_aws_call(s->aws, target, req, resp, ae, err);
}

/* The shards DescribeStream lists now (paged), merged into s->sh: new
 * ones added, the positions of known ones kept, the ones no longer listed
 * (past the retention) dropped. */
static int
describe(struct ddb_stream *s, ik_err *err)
{
	struct ik_aws_error ae;
	cJSON *req, *resp = NULL, *it;
	const char *last = NULL;
	struct shard *sh;
	char *start = NULL;
	size_t i, k;
	int rc;

	for (i = 0; i < s->n; i++)
		s->sh[i].listed = 0;
	/* Bounded: each page names the next one's start, or ends. */
	do {
		req = cJSON_CreateObject();
		cJSON_AddStringToObject(req, "StreamArn", s->arn);
		if (start)
			cJSON_AddStringToObject(req, "ExclusiveStartShardId", start);
		cJSON_Delete(resp);
		rc = streams_call(s, "DescribeStream", req, &resp, &ae, err);
		cJSON_Delete(req);
		if (rc != IK_OK)
			break;
		it = cJSON_GetObjectItemCaseSensitive(resp, "StreamDescription");
		last = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "LastEvaluatedShardId"));
		cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(it, "Shards")) {
			const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "ShardId"));
			if (!id)
				continue;
			if (!(sh = shard_find(s, id)) && !(sh = shard_add(s, id, err))) {
				rc = IK_SOFTWARE;
				break;
			}
			sh->listed = 1;
			set_str(&sh->parent, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it,
			        "ParentShardId")));
		}
		free(start);
		start = last ? strdup(last) : NULL;
	} while (rc == IK_OK && start);
	free(start);
	cJSON_Delete(resp);
	if (rc != IK_OK)
		return rc;
	for (i = k = 0; i < s->n; i++)
		if (s->sh[i].listed)
			s->sh[k++] = s->sh[i];
		else
			shard_free(&s->sh[i]);
	s->n = k;
	return IK_OK;
}

/* ---- reading ------------------------------------------------------------- */

/* Whether sh may be read now: its parent (when still listed) read to its
 * end first, so an item's records come in their order across a split. */
static int
readable(struct ddb_stream *s, const struct shard *sh)
{
	const struct shard *p = shard_find(s, sh->parent);

	return !sh->ended && (!p || p->ended);
}

/* sh's iterator after what was read (its start when nothing was).  A
 * position past the retention: read from the oldest record kept, and the
 * index swept for what was trimmed. */
static int
get_iter(struct ddb_stream *s, struct shard *sh, ik_err *err)
{
	struct ik_aws_error ae;
	cJSON *req, *resp;
	int rc, trimmed = 0;

	for (;;) {
		req = cJSON_CreateObject();
		cJSON_AddStringToObject(req, "StreamArn", s->arn);
		cJSON_AddStringToObject(req, "ShardId", sh->id);
		if (sh->read && !trimmed) {
			cJSON_AddStringToObject(req, "ShardIteratorType", "AFTER_SEQUENCE_NUMBER");
			cJSON_AddStringToObject(req, "SequenceNumber", sh->read);
		} else {
			cJSON_AddStringToObject(req, "ShardIteratorType", "TRIM_HORIZON");
		}
		rc = streams_call(s, "GetShardIterator", req, &resp, &ae, err);
		cJSON_Delete(req);
		if (rc == IK_AWS_ERROR && !trimmed &&
		    strcmp(ae.type, "TrimmedDataAccessException") == 0) {
			cJSON_Delete(resp);
			ik_errclear(err);
			ik_log(IK_LOG_WARN, "outbox: the stream's records after the relay's "
			       "position were trimmed; reading from the oldest kept and sweeping "
			       "the outbox index", "shard", sh->id, NULL);
			s->sweep_due = 1;
			trimmed = 1;
			continue;
		}
		break;
	}
	if (rc == IK_OK)
		set_str(&sh->iter, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(resp,
		        "ShardIterator")));
	cJSON_Delete(resp);
	return rc;
}

/* One GetRecords of sh: the new images with an event waiting appended to
 * out (the relay's item excepted). */
static int
read_shard(struct ddb *d, struct ddb_stream *s, struct shard *sh, cJSON *out, ik_err *err)
{
	struct ik_aws_error ae;
	cJSON *req, *resp = NULL, *rec, *img;
	const char *next, *seq, *key;
	int rc;

	if (!sh->iter && (rc = get_iter(s, sh, err)) != IK_OK)
		return rc;
	req = cJSON_CreateObject();
	cJSON_AddStringToObject(req, "ShardIterator", sh->iter);
	cJSON_AddNumberToObject(req, "Limit", RECORDS_MAX);
	rc = streams_call(s, "GetRecords", req, &resp, &ae, err);
	cJSON_Delete(req);
	if (rc == IK_AWS_ERROR && (strcmp(ae.type, "ExpiredIteratorException") == 0 ||
	                           strcmp(ae.type, "TrimmedDataAccessException") == 0)) {
		/* An iterator lives 15 minutes: taken again where it was. */
		cJSON_Delete(resp);
		ik_errclear(err);
		set_str(&sh->iter, NULL);
		return IK_OK;
	}
	if (rc != IK_OK) {
		cJSON_Delete(resp);
		return rc;
	}
	cJSON_ArrayForEach(rec, cJSON_GetObjectItemCaseSensitive(resp, "Records")) {
		cJSON *db = cJSON_GetObjectItemCaseSensitive(rec, "dynamodb");

		seq = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(db, "SequenceNumber"));
		img = cJSON_GetObjectItemCaseSensitive(db, "NewImage");
		key = ddb_attr_s(img, d->key);
		if (seq)
			set_str(&sh->read, seq);
		if (key && strcmp(key, DDB_RELAY_KEY) != 0 && ddb_attr_s(img, "obPend"))
			cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(db, img));
	}
	next = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(resp, "NextShardIterator"));
	if (!next) {
		/* A closed shard read to its end: its children next. */
		sh->ended = 1;
		set_str(&sh->read, POS_END);
		s->described_ms = 0;
	}
	set_str(&sh->iter, next);
	cJSON_Delete(resp);
	return IK_OK;
}

/* The stream failed in a way the relay cannot mend at once (the streams
 * endpoint down, a role without dynamodb:GetRecords): the index for a
 * while, nothing lost. */
static int
broken(struct ddb_stream *s, ik_err *err)
{
	ik_log(IK_LOG_WARN, "outbox: the table's stream cannot be read; the relay reads "
	       "the outbox index meanwhile", "error", err->msg, NULL);
	ik_errclear(err);
	s->broken_until = ik_mono_ms() + BROKEN_MS;
	s->sweep_due = 1;
	shards_clear(s);
	s->loaded = 0;
	return IK_EMPTY;
}

int
ddb_stream_read(struct ddb *d, cJSON **images, ik_err *err)
{
	struct ddb_stream *s = d->obs;
	int64_t now = ik_mono_ms();
	size_t i;
	int rc;

	*images = NULL;
	if (!s) {
		if (!(s = d->obs = calloc(1, sizeof *s)))
			return ik_errf(err, IK_SOFTWARE, "out of memory");
		s->sweep_due = 1;
		if ((rc = ik_aws_open("dynamodbstreams", &s->aws, err)) != IK_OK ||
		    (rc = find_stream(d, s, err)) != IK_OK) {
			ddb_stream_free(d);
			return rc;
		}
	}
	if (s->off)
		return IK_EMPTY;
	if (s->sweep_due || now - s->swept_ms >= SWEEP_MS || now < s->broken_until)
		return IK_EMPTY;
	if (!s->loaded && (rc = load_positions(d, s, err)) != IK_OK)
		return rc;
	if ((!s->described_ms || now - s->described_ms >= DESCRIBE_MS)) {
		if ((rc = describe(s, err)) != IK_OK)
			return broken(s, err);
		s->described_ms = now;
	}
	if (!(*images = cJSON_CreateArray()))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	for (i = 0; i < s->n; i++)
		if (readable(s, &s->sh[i]) &&
		    (rc = read_shard(d, s, &s->sh[i], *images, err)) != IK_OK) {
			cJSON_Delete(*images);
			*images = NULL;
			return broken(s, err);
		}
	return IK_OK;
}

int
ddb_stream_sweep_due(struct ddb *d)
{
	struct ddb_stream *s = d->obs;

	return !s || s->off || s->sweep_due || ik_mono_ms() - s->swept_ms >= SWEEP_MS ||
	       ik_mono_ms() < s->broken_until;
}

int64_t
ddb_stream_sweep_from(struct ddb *d)
{
	struct ddb_stream *s = d->obs;

	if (!s)
		return ik_now_ms();
	if (!s->sweep_from)
		s->sweep_from = ik_now_ms();
	return s->sweep_from;
}

void
ddb_stream_swept(struct ddb *d, int more)
{
	struct ddb_stream *s = d->obs;

	if (s && !more) {
		s->sweep_due = 0;
		s->sweep_from = 0;
		s->swept_ms = ik_mono_ms();
	}
}

void
ddb_stream_lost(struct ddb *d)
{
	if (d->obs)
		d->obs->sweep_due = 1;
}

/* ---- the checkpoint in the stream ----------------------------------------- */

int
ddb_stream_commit(struct ddb *d, const char *holder, int64_t now_ms, ik_err *err)
{
	struct ddb_stream *s = d->obs;
	cJSON *r, *v, *m;
	size_t i;
	int rc, moved = 0;

	if (!s || s->off || !s->arn || !holder)
		return IK_OK;
	for (i = 0; i < s->n; i++)
		moved |= s->sh[i].done && !same(s->sh[i].done, s->sh[i].saved);
	if (!moved)
		return IK_OK;
	r = ddb_new_req(d, DDB_RELAY_KEY);
	v = cJSON_AddObjectToObject(r, "ExpressionAttributeValues");
	cJSON_AddItemToObject(v, ":h", ddb_av_s(holder));
	cJSON_AddItemToObject(v, ":now", ddb_av_n(now_ms));
	cJSON_AddItemToObject(v, ":arn", ddb_av_s(s->arn));
	m = cJSON_AddObjectToObject(cJSON_AddObjectToObject(v, ":pos"), "M");
	for (i = 0; i < s->n; i++)
		if (s->sh[i].done)
			cJSON_AddItemToObject(m, s->sh[i].id, ddb_av_s(s->sh[i].done));
	rc = ddb_cond_update(d, r, "#rh = :h AND #ru > :now", "SET #sarn = :arn, #spos = :pos",
	                     err);
	if (rc == IK_OK)
		for (i = 0; i < s->n; i++)
			set_str(&s->sh[i].saved, s->sh[i].done);
	return rc;
}
