/* aws_retry.c: the AWS SDKs' "standard" retry mode, for every request the
 * client sends (service calls and STS alike).
 *
 * Rules: AWS_MAX_ATTEMPTS requests in all, never more; only what the
 * classifier calls retryable (throttling, 5xx, 408, a transport failure)
 * is sent again; the wait before try n is full jitter, uniform in
 * [0, min(cap, 50 ms * 2^(n-1))], cap 20 s (IDEMKIT_AWS_MAX_BACKOFF lowers
 * it); a request is sent again unchanged, so its signature is libcurl's
 * fresh one each time.
 */
#include <stdio.h>
#include <string.h>

#include "aws/aws_int.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"

int
ik_aws_judge(int rc, const struct ik_http_res *res, const ik_err *herr,
             struct ik_aws_error *e)
{
	if (rc == IK_OK) {
		ik_aws_classify(res->status, res->body.p, res->body.len,
		                ik_http_header(res, "x-amzn-query-error"),
		                ik_http_header(res, "x-amzn-ErrorType"), e);
	} else if (rc == IK_TEMPFAIL) {
		memset(e, 0, sizeof *e);
		e->kind = IK_AWS_TRANSIENT;
		e->retryable = 1;
		ik_aws_copy_line(e->message, sizeof e->message, herr->msg, strlen(herr->msg));
	}
	return rc;
}

int64_t
ik_aws_retry_wait_ms(const struct ik_aws_cfg *cfg, const char *what,
                     const struct ik_aws_error *e, int attempt)
{
	if (!e->retryable || attempt >= cfg->max_attempts)
		return -1;
	ik_log(IK_LOG_DEBUG, "aws retry", "call", what, IK_LOG_NUM("attempt", attempt),
	       "error", e->type[0] ? e->type : e->message, NULL);
	return ik_backoff_jitter(IK_AWS_BACKOFF_BASE_MS, cfg->backoff_cap_ms, attempt - 1);
}

int
ik_aws_send(const struct ik_aws_cfg *cfg, const char *what,
            const struct ik_http_req *req, struct ik_http_res *res,
            struct ik_aws_error *e, int *tries, ik_err *err)
{
	ik_err herr = { 0 };
	int64_t wait;
	int attempt, rc;

	for (attempt = 1; ; attempt++) {
		*tries = attempt;
		rc = ik_aws_judge(ik_http_do(cfg->http, req, res, &herr), res, &herr, e);
		if (rc != IK_OK && rc != IK_TEMPFAIL)
			return ik_errf(err, rc, "%s", herr.msg);
		if ((wait = ik_aws_retry_wait_ms(cfg, what, e, attempt)) < 0)
			break;
		/* A stop signal ends the wait, not the attempts: the call in
		 * hand still gets the tries it has left. */
		ik_sleep_ms(wait);
	}
	if (rc != IK_OK)
		return ik_errf(err, rc, "%s", e->message);
	return IK_OK;
}
