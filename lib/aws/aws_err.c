/* aws_err.c: the AWS error classifier, pure: an HTTP status, an error body
 * (JSON protocol, or the XML of the query protocol STS speaks) and two
 * header values become a short error name, a bounded one-line message
 * and a kind (aws.h).
 *
 * Rules: a credentials or permission error is never retried (retrying an
 * AccessDenied only delays the alarm); throttling and 5xx are; anything
 * else is the caller's to judge.  The message is one line, bounded, and
 * never the canonical request a signature error can quote.  No I/O: the
 * fuzz target drives this file.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "aws/aws.h"
#include "aws/aws_int.h"
#include "core/outcome.h"

static const char *const throttle_codes[] = {
	"Throttling", "ThrottlingException", "ThrottledException",
	"RequestThrottledException", "TooManyRequestsException",
	"ProvisionedThroughputExceededException", "TransactionInProgressException",
	"RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException",
	"RequestThrottled", "SlowDown", "PriorRequestNotComplete",
	"EC2ThrottledException", NULL,
};
static const char *const transient_codes[] = {
	"RequestTimeout", "RequestTimeoutException", "InternalError",
	"InternalServerError", "InternalFailure", "InternalService",
	"ServiceUnavailable", "ServiceUnavailableException",
	"IDPCommunicationError", NULL,
};
static const char *const auth_codes[] = {
	"UnrecognizedClientException", "InvalidSignatureException",
	"AccessDeniedException", "AccessDenied", "MissingAuthenticationToken",
	"MissingAuthenticationTokenException", "ExpiredToken",
	"ExpiredTokenException", "InvalidClientTokenId", "IncompleteSignature",
	"IncompleteSignatureException", "SignatureDoesNotMatch", "AuthFailure",
	"InvalidAccessKeyId", "InvalidToken", "RequestExpired",
	"UnauthorizedOperation", "NotAuthorized", "InvalidSecurity",
	"InvalidIdentityToken", "IDPRejectedClaim", "RegionDisabledException", NULL,
};

static int
in_list(const char *const *l, const char *s)
{
	if (!s || !*s)
		return 0;
	for (; *l; l++)
		if (strcmp(*l, s) == 0)
			return 1;
	return 0;
}

void
ik_aws_copy_line(char *out, size_t outsz, const char *s, size_t n)
{
	size_t i, o = 0;

	for (i = 0; i < n && s[i] && s[i] != '\n' && s[i] != '\r' && o + 1 < outsz; i++)
		out[o++] = iscntrl((unsigned char)s[i]) ? ' ' : s[i];
	out[o] = '\0';
}

/* "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException" ->
 * "ConditionalCheckFailedException"; "ValidationException:http://..." ->
 * "ValidationException". */
static void
short_type(char *out, size_t outsz, const char *t)
{
	const char *h = strrchr(t, '#');
	size_t n;

	if (h)
		t = h + 1;
	n = strcspn(t, ":");
	ik_aws_copy_line(out, outsz, t, n);
}

/* The text of the first <tag>...</tag> in body[0..len), or NULL; *n is
 * its length.  Enough for the query protocol's flat error document
 * (<ErrorResponse><Error><Code>...); the body need not end in a NUL. */
const char *
ik_aws_xml_text(const char *body, size_t len, const char *tag, size_t *n)
{
	char open[64], close[64];
	size_t ol, cl, i;
	const char *s = NULL;

	ol = (size_t)snprintf(open, sizeof open, "<%s>", tag);
	cl = (size_t)snprintf(close, sizeof close, "</%s>", tag);
	if (ol >= sizeof open || cl >= sizeof close)
		return NULL;
	for (i = 0; i + ol <= len; i++)
		if (memcmp(body + i, open, ol) == 0) {
			s = body + i + ol;
			break;
		}
	if (!s)
		return NULL;
	for (i = (size_t)(s - body); i + cl <= len; i++)
		if (memcmp(body + i, close, cl) == 0) {
			*n = i - (size_t)(s - body);
			return s;
		}
	return NULL;
}

static void
from_xml(const char *body, size_t len, struct ik_aws_error *e)
{
	const char *v;
	size_t n;

	if ((v = ik_aws_xml_text(body, len, "Code", &n)))
		ik_aws_copy_line(e->type, sizeof e->type, v, n);
	if ((v = ik_aws_xml_text(body, len, "Message", &n)))
		ik_aws_copy_line(e->message, sizeof e->message, v, n);
}

void
ik_aws_classify(long status, const char *body, size_t len,
                const char *query_error_hdr, const char *error_type_hdr,
                struct ik_aws_error *e)
{
	cJSON *j = NULL, *t, *m;
	const char *q, *last;
	char *cut;
	size_t i;

	memset(e, 0, sizeof *e);
	e->status = status;
	if (status >= 200 && status < 300) {
		e->kind = IK_AWS_OK;
		return;
	}
	for (i = 0; body && i < len && isspace((unsigned char)body[i]); i++)
		;
	if (body && i < len && body[i] == '<')
		from_xml(body, len, e);
	else if (body && len)
		j = cJSON_ParseWithLength(body, len);
	if (cJSON_IsObject(j)) {
		t = cJSON_GetObjectItemCaseSensitive(j, "__type");
		if (!cJSON_IsString(t))
			t = cJSON_GetObjectItemCaseSensitive(j, "code");
		if (cJSON_IsString(t))
			short_type(e->type, sizeof e->type, t->valuestring);
		m = cJSON_GetObjectItemCaseSensitive(j, "message");
		if (!cJSON_IsString(m))
			m = cJSON_GetObjectItemCaseSensitive(j, "Message");
		if (cJSON_IsString(m))
			ik_aws_copy_line(e->message, sizeof e->message, m->valuestring,
			                 strlen(m->valuestring));
	}
	cJSON_Delete(j);
	if (!e->type[0] && error_type_hdr && *error_type_hdr)
		short_type(e->type, sizeof e->type, error_type_hdr);
	if (query_error_hdr && *query_error_hdr)
		ik_aws_copy_line(e->query, sizeof e->query, query_error_hdr,
		                 strcspn(query_error_hdr, ";"));
	/* A signature error may quote the canonical request: keep the sentence
	 * before it only. */
	if ((cut = strstr(e->message, "The Canonical String")))
		*cut = '\0';
	if (!e->message[0])
		snprintf(e->message, sizeof e->message, "HTTP %ld", status);

	/* "AWS.SimpleQueueService.NonExistentQueue" is matched as its last part. */
	q = e->query;
	last = strrchr(q, '.');
	last = last ? last + 1 : q;

	if (in_list(auth_codes, e->type) || in_list(auth_codes, last))
		e->kind = IK_AWS_AUTH;
	else if (in_list(throttle_codes, e->type) || in_list(throttle_codes, last))
		e->kind = IK_AWS_THROTTLE;
	else if (in_list(transient_codes, e->type) || in_list(transient_codes, last))
		e->kind = IK_AWS_TRANSIENT;
	else if (status == 429)
		e->kind = IK_AWS_THROTTLE;
	else if (status == 408 || (status >= 500 && status != 501))
		e->kind = IK_AWS_TRANSIENT;
	else if ((status == 401 || status == 403) && !e->type[0])
		e->kind = IK_AWS_AUTH;
	else
		e->kind = IK_AWS_CLIENT;
	e->retryable = e->kind == IK_AWS_THROTTLE || e->kind == IK_AWS_TRANSIENT;
}

int
ik_aws_kind_code(enum ik_aws_kind k)
{
	switch (k) {
	case IK_AWS_OK:        return IK_OK;
	case IK_AWS_THROTTLE:
	case IK_AWS_TRANSIENT: return IK_TEMPFAIL;
	case IK_AWS_AUTH:      return IK_CONFIG;
	case IK_AWS_CLIENT:    break;
	}
	return IK_AWS_ERROR;
}
