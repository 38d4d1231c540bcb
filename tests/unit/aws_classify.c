/* aws_classify: the AWS error classifier (ik_aws_classify) on recorded
 * DynamoDB and SQS error responses.  Prints one "ok"/"not ok" line per
 * case; exits 1 when any failed.  Run by tests/aws.bats. */
#include <stdio.h>
#include <string.h>

#include "aws/aws.h"
#include "core/outcome.h"

static int failed, n;

static void
check(const char *name, long status, const char *body, const char *qhdr,
      const char *thdr, enum ik_aws_kind kind, const char *type,
      const char *query, const char *msg_has, const char *msg_lacks)
{
	struct ik_aws_error e;
	int ok;

	ik_aws_classify(status, body, body ? strlen(body) : 0, qhdr, thdr, &e);
	ok = e.kind == kind && e.status == status &&
	     e.retryable == (kind == IK_AWS_THROTTLE || kind == IK_AWS_TRANSIENT) &&
	     (!type || strcmp(e.type, type) == 0) &&
	     (!query || strcmp(e.query, query) == 0) &&
	     (!msg_has || strstr(e.message, msg_has)) &&
	     (!msg_lacks || !strstr(e.message, msg_lacks)) &&
	     !strchr(e.message, '\n');
	n++;
	printf("%s %d - %s (kind=%d type=%s query=%s code=%d msg=%s)\n",
	       ok ? "ok" : "not ok", n, name, e.kind, e.type, e.query,
	       ik_aws_kind_code(e.kind), e.message);
	failed |= !ok;
}

#define DDB "com.amazonaws.dynamodb.v20120810#"
#define CORAL "com.amazon.coral.service#"

int
main(void)
{
	check("ddb 200 is OK", 200, "{}", NULL, NULL, IK_AWS_OK, "", "", NULL, NULL);
	/* STS speaks the query protocol: an XML error document */
	check("sts AccessDenied (XML)", 403,
	      "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error><Type>Sender</Type>"
	      "<Code>AccessDenied</Code><Message>User: arn:aws:iam::1:user/w is not authorized to perform: sts:AssumeRole</Message>"
	      "</Error><RequestId>r</RequestId></ErrorResponse>",
	      NULL, NULL, IK_AWS_AUTH, "AccessDenied", "", "not authorized to perform", NULL);
	check("sts InvalidIdentityToken (XML)", 400,
	      "\n<ErrorResponse><Error><Code>InvalidIdentityToken</Code><Message>Couldn't verify</Message></Error></ErrorResponse>",
	      NULL, NULL, IK_AWS_AUTH, "InvalidIdentityToken", "", "Couldn't verify", NULL);
	check("sts IDPCommunicationError (XML) is transient", 400,
	      "<ErrorResponse><Error><Code>IDPCommunicationError</Code><Message>try again</Message></Error></ErrorResponse>",
	      NULL, NULL, IK_AWS_TRANSIENT, "IDPCommunicationError", "", NULL, NULL);
	check("sts Throttling (XML)", 400,
	      "<ErrorResponse><Error><Code>Throttling</Code><Message>Rate exceeded</Message></Error></ErrorResponse>",
	      NULL, NULL, IK_AWS_THROTTLE, "Throttling", "", "Rate exceeded", NULL);
	check("truncated XML: no code, status decides", 503, "<ErrorResponse><Error><Code>Throt",
	      NULL, NULL, IK_AWS_TRANSIENT, "", "", "HTTP 503", NULL);
	check("ddb ThrottlingException", 400,
	      "{\"__type\":\"" DDB "ThrottlingException\",\"message\":\"Rate of requests exceeds the allowed throughput.\"}",
	      NULL, NULL, IK_AWS_THROTTLE, "ThrottlingException", "", "Rate of requests", NULL);
	check("ddb ProvisionedThroughputExceededException", 400,
	      "{\"__type\":\"" DDB "ProvisionedThroughputExceededException\",\"message\":\"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.\"}",
	      NULL, NULL, IK_AWS_THROTTLE, "ProvisionedThroughputExceededException", "", "provisioned", NULL);
	check("ddb RequestLimitExceeded", 400,
	      "{\"__type\":\"" DDB "RequestLimitExceeded\",\"message\":\"Throughput exceeds the current throughput limit for your account.\"}",
	      NULL, NULL, IK_AWS_THROTTLE, "RequestLimitExceeded", "", NULL, NULL);
	check("ddb TransactionInProgressException", 400,
	      "{\"__type\":\"" DDB "TransactionInProgressException\",\"message\":\"Operation was rejected because there is an ongoing transaction for the item.\"}",
	      NULL, NULL, IK_AWS_THROTTLE, "TransactionInProgressException", "", NULL, NULL);
	check("ddb ValidationException is a client error", 400,
	      "{\"__type\":\"com.amazon.coral.validate#ValidationException\",\"message\":\"One or more parameter values were invalid: Missing the key pk in the item\"}",
	      NULL, NULL, IK_AWS_CLIENT, "ValidationException", "", "Missing the key pk", NULL);
	check("ddb ConditionalCheckFailedException (with ALL_OLD item)", 400,
	      "{\"__type\":\"" DDB "ConditionalCheckFailedException\",\"message\":\"The conditional request failed\","
	      "\"Item\":{\"pk\":{\"S\":\"CHG-1\"},\"state\":{\"S\":\"DONE\"}}}",
	      NULL, NULL, IK_AWS_CLIENT, "ConditionalCheckFailedException", "", "conditional request failed", NULL);
	check("ddb ResourceNotFoundException", 400,
	      "{\"__type\":\"" DDB "ResourceNotFoundException\",\"message\":\"Requested resource not found\"}",
	      NULL, NULL, IK_AWS_CLIENT, "ResourceNotFoundException", "", NULL, NULL);
	check("ddb AccessDeniedException (capital Message)", 400,
	      "{\"__type\":\"" CORAL "AccessDeniedException\",\"Message\":\"User: arn:aws:iam::123456789012:user/w is not authorized to perform: dynamodb:UpdateItem on resource: arn:aws:dynamodb:us-east-1:123456789012:table/idem\"}",
	      NULL, NULL, IK_AWS_AUTH, "AccessDeniedException", "", "not authorized", NULL);
	check("ddb UnrecognizedClientException", 400,
	      "{\"__type\":\"" CORAL "UnrecognizedClientException\",\"message\":\"The security token included in the request is invalid.\"}",
	      NULL, NULL, IK_AWS_AUTH, "UnrecognizedClientException", "", NULL, NULL);
	check("ddb ExpiredTokenException", 400,
	      "{\"__type\":\"" CORAL "ExpiredTokenException\",\"message\":\"The security token included in the request is expired\"}",
	      NULL, NULL, IK_AWS_AUTH, "ExpiredTokenException", "", NULL, NULL);
	check("ddb MissingAuthenticationTokenException", 400,
	      "{\"__type\":\"" CORAL "MissingAuthenticationTokenException\",\"message\":\"Request is missing Authentication Token\"}",
	      NULL, NULL, IK_AWS_AUTH, "MissingAuthenticationTokenException", "", NULL, NULL);
	check("InvalidSignatureException never quotes the canonical request", 400,
	      "{\"__type\":\"" CORAL "InvalidSignatureException\",\"message\":\"The request signature we calculated does not match the signature you provided. "
	      "The Canonical String for this request should have been\\n'POST\\n/\\n\\nx-amz-security-token:SECRETTOKEN\\n'\"}",
	      NULL, NULL, IK_AWS_AUTH, "InvalidSignatureException", "", "does not match", "SECRETTOKEN");
	check("ddb InternalServerError 500", 500,
	      "{\"__type\":\"" DDB "InternalServerError\",\"message\":\"Internal server error\"}",
	      NULL, NULL, IK_AWS_TRANSIENT, "InternalServerError", "", NULL, NULL);
	check("503 without a body", 503, "", NULL, NULL, IK_AWS_TRANSIENT, "", "", "HTTP 503", NULL);
	check("502 HTML from a proxy", 502, "<html>Bad Gateway</html>", NULL, NULL,
	      IK_AWS_TRANSIENT, "", "", "HTTP 502", NULL);
	check("429 without a type", 429, "", NULL, NULL, IK_AWS_THROTTLE, "", "", NULL, NULL);
	check("408 without a type", 408, "", NULL, NULL, IK_AWS_TRANSIENT, "", "", NULL, NULL);
	check("403 without a type", 403, "", NULL, NULL, IK_AWS_AUTH, "", "", NULL, NULL);
	check("413 without a type", 413, "", NULL, NULL, IK_AWS_CLIENT, "", "", NULL, NULL);
	check("type from x-amzn-ErrorType when the body has none", 400, "", NULL,
	      "ThrottlingException:http://internal.amazon.com/coral/com.amazon.coral.availability/",
	      IK_AWS_THROTTLE, "ThrottlingException", "", NULL, NULL);
	check("sqs QueueDoesNotExist + query-error header", 400,
	      "{\"__type\":\"com.amazonaws.sqs#QueueDoesNotExist\",\"message\":\"The specified queue does not exist.\"}",
	      "AWS.SimpleQueueService.NonExistentQueue;Sender", NULL, IK_AWS_CLIENT,
	      "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "does not exist", NULL);
	check("sqs throttling known only from the query-error header", 400,
	      "{\"message\":\"Rate exceeded\"}", "AWS.SimpleQueueService.RequestThrottled;Sender", NULL,
	      IK_AWS_THROTTLE, "", "AWS.SimpleQueueService.RequestThrottled", "Rate exceeded", NULL);
	check("sqs AccessDenied", 403,
	      "{\"__type\":\"com.amazonaws.sqs#AccessDeniedException\",\"message\":\"Access to the resource https://sqs.us-east-1.amazonaws.com/123/q is denied.\"}",
	      "AccessDenied;Sender", NULL, IK_AWS_AUTH, "AccessDeniedException", "AccessDenied", "denied", NULL);
	check("sqs InvalidParameterValue", 400,
	      "{\"__type\":\"com.amazonaws.sqs#InvalidParameterValueException\",\"message\":\"Value 99 for parameter MaxNumberOfMessages is invalid.\"}",
	      "InvalidParameterValue;Sender", NULL, IK_AWS_CLIENT, "InvalidParameterValueException",
	      "InvalidParameterValue", NULL, NULL);
	check("kind codes", 400, "{\"__type\":\"x#ThrottlingException\"}", NULL, NULL,
	      IK_AWS_THROTTLE, NULL, NULL, NULL, NULL);
	if (ik_aws_kind_code(IK_AWS_THROTTLE) != IK_TEMPFAIL ||
	    ik_aws_kind_code(IK_AWS_TRANSIENT) != IK_TEMPFAIL ||
	    ik_aws_kind_code(IK_AWS_AUTH) != IK_CONFIG ||
	    ik_aws_kind_code(IK_AWS_CLIENT) != IK_AWS_ERROR) {
		printf("not ok - kind -> code mapping\n");
		failed = 1;
	}
	printf("%s\n", failed ? "FAILED" : "PASSED");
	return failed;
}
