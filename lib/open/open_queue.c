/* open_queue.c: the queue port's factory (open_queue.h): picks the queue
 * adapter from the URL (the only place that names the adapters), and owns
 * the default URLs and the DLQ rule.  URLs are checked here, so a typo is
 * one clear IK_CONFIG line before any file is created or any request is
 * sent. */
#include <stdlib.h>
#include <string.h>

#include "core/outcome.h"
#include "core/util.h"
#include "open/open_queue.h"
#include "queue/amqp/queue_amqp.h"
#include "queue/queue.h"
#include "queue/sqlite/queue_sqlite.h"
#include "queue/sqs/queue_sqs.h"

#define DEFAULT_NAME "charges"
#define NAME_MAX_LEN 80

static const char expected[] =
	"expected sqlite:PATH#NAME, an SQS queue URL "
	"(https://sqs.REGION.amazonaws.com/ACCOUNT/NAME) or "
	"amqp[s]://USER@HOST[:PORT][/VHOST]#QUEUE (RabbitMQ)";

/* SQS queue names: 1-80 of [A-Za-z0-9_-], ".fifo" allowed at the end. */
static int
valid_name(const char *s, size_t n)
{
	if (n >= 5 && memcmp(s + n - 5, ".fifo", 5) == 0)
		n -= 5;
	if (n == 0 || n > NAME_MAX_LEN)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= 'A' && s[i] <= 'Z') &&
		    !(s[i] >= '0' && s[i] <= '9') && s[i] != '_' && s[i] != '-')
			return 0;
	return 1;
}

/* sqlite:PATH#NAME[?params]: split into malloc'd parts. */
static int
split_sqlite(const char *url, char **path, char **name, char **params, ik_err *err)
{
	const char *p = url + strlen("sqlite:");
	const char *hash = strrchr(p, '#');
	const char *q;

	if (!hash)
		return ik_errf(err, IK_CONFIG, "queue URL '%s': no #NAME after the path; %s",
		               url, expected);
	if (hash == p)
		return ik_errf(err, IK_CONFIG, "queue URL '%s': empty path; %s", url, expected);
	q = strchr(hash, '?');
	if (!valid_name(hash + 1, q ? (size_t)(q - hash - 1) : strlen(hash + 1)))
		return ik_errf(err, IK_CONFIG,
		               "queue URL '%s': the queue name must be 1-80 of "
		               "[A-Za-z0-9_-]", url);
	*path = strndup(p, (size_t)(hash - p));
	*name = q ? strndup(hash + 1, (size_t)(q - hash - 1)) : strdup(hash + 1);
	*params = strdup(q ? q + 1 : "");
	if (!*path || !*name || !*params) {
		free(*path), free(*name), free(*params);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	return IK_OK;
}

/* http(s)://HOST[:PORT]/.../ACCOUNT/NAME */
static int
check_sqs(const char *url, ik_err *err)
{
	const char *p = strstr(url, "://") + 3;
	const char *slash = strchr(p, '/');
	const char *last;

	if (slash == p)
		return ik_errf(err, IK_CONFIG, "queue URL '%s': no host; %s", url, expected);
	if (!slash)
		return ik_errf(err, IK_CONFIG, "queue URL '%s': no /ACCOUNT/NAME path; %s",
		               url, expected);
	for (const char *c = p; c < slash; c++)
		if (*c == ' ' || *c == '@' || *c == '?' || *c == '#')
			return ik_errf(err, IK_CONFIG, "queue URL '%s': bad host; %s",
			               url, expected);
	last = strrchr(slash, '/');
	if (last == slash || !valid_name(last + 1, strlen(last + 1)) ||
	    strpbrk(slash, "?# ") || strstr(slash, "//"))
		return ik_errf(err, IK_CONFIG,
		               "queue URL '%s': the path must be /ACCOUNT/NAME; %s", url, expected);
	return IK_OK;
}

static char *
default_url(ik_err *err)
{
	const char *env = getenv("IDEMKIT_QUEUE");
	struct ik_buf b = { 0 };
	char *dir;

	if (env && *env)
		return strdup(env);
	if (!(dir = ik_state_dir(1, err)))
		return NULL;
	if (ik_buf_addstr(&b, "sqlite:") || ik_buf_addstr(&b, dir) ||
	    ik_buf_addstr(&b, "/queue.db#" DEFAULT_NAME)) {
		ik_buf_free(&b);
		b.p = NULL;
		ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	free(dir);
	return b.p;
}

int
ik_queue_open(const char *url, struct ik_queue **out, ik_err *err)
{
	struct ik_queue *q;
	char *u, *path = NULL, *name = NULL, *params = NULL;
	int rc;

	*out = NULL;
	u = url ? strdup(url) : default_url(err);
	if (!u)
		return url ? ik_errf(err, IK_SOFTWARE, "out of memory")
		           : (err ? err->code : IK_CONFIG);
	if (!(q = calloc(1, sizeof *q))) {
		free(u);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	q->url = u;
	if (strncmp(u, "sqlite:", 7) == 0) {
		rc = split_sqlite(u, &path, &name, &params, err);
		if (rc == IK_OK)
			rc = ik_queue_sqlite_open(path, name, params, q, err);
		free(path), free(name), free(params);
	} else if (strncmp(u, "https://", 8) == 0 || strncmp(u, "http://", 7) == 0) {
		rc = check_sqs(u, err);
		if (rc == IK_OK)
			rc = ik_queue_sqs_open(u, q, err);
	} else if (strncmp(u, "amqp://", 7) == 0 || strncmp(u, "amqps://", 8) == 0) {
		rc = ik_queue_amqp_open(u, q, err);
	} else {
		rc = ik_errf(err, IK_CONFIG, "queue URL '%s': unknown scheme; %s", u, expected);
	}
	if (rc != IK_OK) {
		free(q->url);
		free(q);
		return rc;
	}
	*out = q;
	return IK_OK;
}

/* A dlq=NAME parameter in a sqlite URL's query string, or NULL. */
static char *
param_dlq(const char *params)
{
	const char *p = params;

	while (p && *p) {
		if (strncmp(p, "dlq=", 4) == 0)
			return strndup(p + 4, strcspn(p + 4, "&"));
		p = strchr(p, '&');
		if (p)
			p++;
	}
	return NULL;
}

/* amqp[s]://...#NAME[?params]: the same broker's DLQ, its dlq= or
 * NAME-dlq (the queue the adapter dead-letters to). */
static char *
amqp_dlq_url(const char *url, ik_err *err)
{
	const char *hash = strrchr(url, '#'), *q;
	struct ik_buf b = { 0 };
	char *pd;

	if (!hash)
		return (ik_errf(err, IK_CONFIG, "queue URL '%s': no #QUEUE; %s", url, expected),
		        NULL);
	q = strchr(hash, '?');
	pd = q ? param_dlq(q + 1) : NULL;
	if (ik_buf_add(&b, url, (size_t)(hash - url + 1)) ||
	    (pd ? ik_buf_addstr(&b, pd)
	        : (ik_buf_add(&b, hash + 1, q ? (size_t)(q - hash - 1) : strlen(hash + 1)) ||
	           ik_buf_addstr(&b, "-dlq")))) {
		ik_buf_free(&b);
		free(pd);
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	free(pd);
	return b.p;
}

char *
ik_queue_dlq_url(const char *dlq, const char *queue_url, ik_err *err)
{
	const char *env = getenv("IDEMKIT_DLQ");
	char *path = NULL, *name = NULL, *params = NULL, *pd, *r = NULL;
	struct ik_buf b = { 0 };

	if (dlq && *dlq)
		return strdup(dlq);
	if (env && *env)
		return strdup(env);
	if (queue_url && (strncmp(queue_url, "amqp://", 7) == 0 ||
	                  strncmp(queue_url, "amqps://", 8) == 0))
		return amqp_dlq_url(queue_url, err);
	if (!queue_url || strncmp(queue_url, "sqlite:", 7) != 0) {
		ik_errf(err, IK_CONFIG, "no dead-letter queue for %s: give --dlq or IDEMKIT_DLQ",
		        queue_url ? queue_url : "the queue");
		return NULL;
	}
	if (split_sqlite(queue_url, &path, &name, &params, err) != IK_OK)
		return NULL;
	pd = param_dlq(params);
	if (ik_buf_addstr(&b, "sqlite:") || ik_buf_addstr(&b, path) ||
	    ik_buf_addstr(&b, "#") || ik_buf_addstr(&b, pd ? pd : name) ||
	    (!pd && ik_buf_addstr(&b, "-dlq")))
		ik_errf(err, IK_SOFTWARE, "out of memory");
	else
		r = b.p, b.p = NULL;
	ik_buf_free(&b);
	free(pd), free(path), free(name), free(params);
	return r;
}
