/* aws.h: a small AWS client for the JSON protocol (DynamoDB, SQS).
 *
 * Follows the AWS CLI's conventions as far as they apply to a daemon:
 *  credentials  the AWS CLI's chain, first source that applies only
 *               (aws_cred.c; idemkit(7) "AWS credentials"): env keys; the
 *               profile's role_arn (STS AssumeRole); web identity (STS
 *               AssumeRoleWithWebIdentity); the profile's keys,
 *               credential_process; container credentials; EC2 IMDSv2.  A
 *               profile naming a method idemkit does not follow (SSO, MFA)
 *               is IK_CONFIG, never a fall-back.  Temporary credentials are
 *               refreshed from the same source before they expire.
 *  region       AWS_REGION, AWS_DEFAULT_REGION, the profile's region.
 *  endpoint     AWS_ENDPOINT_URL_<SERVICE>, AWS_ENDPOINT_URL, else
 *               https://SERVICE.REGION.amazonaws.com; AWS_CA_BUNDLE.
 *               DynamoDB Streams: AWS_ENDPOINT_URL_DYNAMODB_STREAMS,
 *               AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_DYNAMODB, else
 *               https://streams.dynamodb.REGION.amazonaws.com.
 *  retries      standard mode: AWS_MAX_ATTEMPTS (default 3) attempts in
 *               all, full-jitter exponential backoff (base 50 ms, cap 20 s;
 *               IDEMKIT_AWS_MAX_BACKOFF lowers the cap, for tests).
 * Requests are signed by libcurl (CURLOPT_AWS_SIGV4).  Messages never hold
 * a key, a token or a signature.
 */
#ifndef IK_AWS_H
#define IK_AWS_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/err.h"

/* Returned by ik_aws_call for an AWS error the caller must judge (a client
 * error that is neither retryable nor about credentials): not an exit
 * code.  aerr holds the error and err a ready message (code IK_SOFTWARE). */
#define IK_AWS_ERROR (-1)

enum ik_aws_kind {
	IK_AWS_OK = 0,
	IK_AWS_THROTTLE,    /* retryable: throttling */
	IK_AWS_TRANSIENT,   /* retryable: 5xx, 408, timeouts, transport */
	IK_AWS_AUTH,        /* credentials or permissions: IK_CONFIG */
	IK_AWS_CLIENT,      /* anything else: the caller decides */
};

struct ik_aws_error {
	char type[128];     /* short name: "ConditionalCheckFailedException";
	                       "" for a transport error */
	char query[128];    /* x-amzn-query-error code, e.g.
	                       "AWS.SimpleQueueService.NonExistentQueue"; or "" */
	char message[512];  /* the service's message, one line, bounded */
	long status;        /* HTTP status, 0 when none arrived */
	int retryable;
	enum ik_aws_kind kind;
};

struct ik_aws;

/* service: "dynamodb", "dynamodbstreams" or "sqs".  Resolves region, endpoint and
 * credentials now.  IK_OK, IK_CONFIG (no region, no credentials, a bad
 * setting), IK_TEMPFAIL (a credential endpoint unreachable). */
int ik_aws_open(const char *service, struct ik_aws **out, ik_err *err);
void ik_aws_close(struct ik_aws *a);           /* wipes the credentials */

const char *ik_aws_region(const struct ik_aws *a);
const char *ik_aws_endpoint(const struct ik_aws *a);
/* Where the credentials came from: "env", "assume-role", "web-identity",
 * "shared-credentials-file", "credential-process", "config-file",
 * "container", "imds". */
const char *ik_aws_cred_source(const struct ik_aws *a);
/* The access key id (not a secret), for diagnostics. */
const char *ik_aws_access_key_id(const struct ik_aws *a);
/* The request timeout (IDEMKIT_AWS_TIMEOUT, default 10 s), resolved once
 * here: an adapter that sizes a long poll under it asks instead of
 * parsing the variable again. */
long ik_aws_timeout_ms(const struct ik_aws *a);

/* POST req (not consumed) to the endpoint with X-Amz-Target: target
 * ("DynamoDB_20120810.PutItem"), retrying as above.  Returns:
 *   IK_OK         *resp = the parsed response object (caller frees);
 *   IK_AWS_ERROR  a client error for the caller: aerr filled, and *resp =
 *                 the parsed error body when it is a JSON object (caller
 *                 frees; e.g. the Item that ReturnValuesOnConditionCheck-
 *                 Failure=ALL_OLD adds to a ConditionalCheckFailedException);
 *   IK_TEMPFAIL   retryable trouble that outlasted the attempts;
 *   IK_CONFIG     bad credentials/permissions, endpoint or TLS set-up;
 *   IK_SOFTWARE   out of memory, a response we cannot read.
 * err reads "dynamodb PutItem: ThrottlingException: message".  aerr may
 * be NULL when the caller does not need it.  On other codes *resp = NULL. */
int ik_aws_call(struct ik_aws *a, const char *target, const cJSON *req,
                cJSON **resp, struct ik_aws_error *aerr, ik_err *err);

/* Calls in flight (issue 16): many calls of one client outstanding at once,
 * from one thread, on the client's one HTTP handle (kept-alive
 * connections).  A finished call reports to its callback what ik_aws_call
 * would have returned: rc, resp (the callback owns it, NULL unless rc is
 * IK_OK or IK_AWS_ERROR with a JSON error body), aerr and err (err only when
 * rc != IK_OK).  The retries are the same standard mode, but the backoff
 * between tries is a timer ik_aws_run keeps, never a sleep, so one call's
 * backoff holds up no other (a stop signal makes every pending backoff due
 * at once: the call still gets its tries). */
typedef void (*ik_aws_cb)(void *arg, int rc, cJSON *resp, const struct ik_aws_error *aerr,
                          const ik_err *err);

/* Starts a call (target and req are copied now; they need not outlive
 * this).  IK_OK: cb
 * is called exactly once, from a later ik_aws_run.  Any other code (as
 * ik_aws_call would return it, e.g. credentials that cannot be refreshed):
 * nothing was started and cb is never called. */
int ik_aws_submit(struct ik_aws *a, const char *target, const cJSON *req,
                  ik_aws_cb cb, void *arg, ik_err *err);

/* Calls submitted and not yet reported. */
size_t ik_aws_active(const struct ik_aws *a);

/* Moves every call on: runs the callbacks of those finished and resends
 * those whose backoff is over.  When none finished, first waits up to
 * timeout_ms (-1: as long as it takes; a pending backoff shortens it) for
 * one, or for fds (poll(2) style, at most IK_HTTP_EXTRA_FDS; revents set).
 * IK_OK or IK_SOFTWARE (a broken multi handle: the calls are lost). */
struct pollfd;
int ik_aws_run(struct ik_aws *a, struct pollfd *fds, unsigned nfds, int timeout_ms,
               ik_err *err);

/* The classifier, pure: from the status, the body and the
 * x-amzn-query-error and x-amzn-ErrorType header values (either may be
 * NULL) fill e.  A 2xx status is IK_AWS_OK. */
void ik_aws_classify(long status, const char *body, size_t len,
                     const char *query_error_hdr, const char *error_type_hdr,
                     struct ik_aws_error *e);

/* The outcome code for an error kind: THROTTLE/TRANSIENT -> IK_TEMPFAIL,
 * AUTH -> IK_CONFIG, CLIENT -> IK_AWS_ERROR. */
int ik_aws_kind_code(enum ik_aws_kind k);

#endif
