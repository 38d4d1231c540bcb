/* libFuzzer target: the AWS error classifier (ik_aws_classify) on any
 * status, body and header values.  Input: two bytes of status, then the
 * body, the x-amzn-query-error value and the x-amzn-ErrorType value,
 * separated by NUL bytes (a missing part is NULL).  Beyond "no crash" it
 * checks what callers rely on: the fields are bounded one-line strings, a
 * signature error never quotes the canonical request, 2xx is OK, the
 * retry flag agrees with the kind, and every kind maps to a contract code. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "aws/aws.h"
#include "core/outcome.h"

static void
check_str(const char *s, size_t sz)
{
	if (!memchr(s, '\0', sz))
		abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ik_aws_error e;
	const char *part[3] = { NULL, NULL, NULL };
	size_t blen = 0;
	char *buf;
	long status;
	int code;

	if (size < 2)
		return 0;
	status = 100 + (long)((data[0] << 8 | data[1]) % 500);
	if (!(buf = malloc(size - 2 + 1)))
		return 0;
	memcpy(buf, data + 2, size - 2);
	buf[size - 2] = '\0';
	/* body (binary, by length), then two C-string headers */
	{
		char *p = buf, *end = buf + (size - 2), *nul;
		int i;

		for (i = 0; i < 3 && p <= end; i++) {
			nul = memchr(p, '\0', (size_t)(end - p) + 1);
			part[i] = p;
			if (i == 0)
				blen = (size_t)(nul - p);
			p = nul + 1;
		}
	}
	/* the body is passed by length: use it without its NUL, as curl would */
	ik_aws_classify(status, part[0], blen, part[1], part[2], &e);

	check_str(e.type, sizeof e.type);
	check_str(e.query, sizeof e.query);
	check_str(e.message, sizeof e.message);
	if (e.status != status)
		abort();
	if ((status >= 200 && status < 300) != (e.kind == IK_AWS_OK))
		abort();
	if (e.kind != IK_AWS_OK) {
		if (!e.message[0] || strchr(e.message, '\n') || strchr(e.message, '\r'))
			abort();
		if (strstr(e.message, "The Canonical String"))
			abort();
	}
	if (e.retryable != (e.kind == IK_AWS_THROTTLE || e.kind == IK_AWS_TRANSIENT))
		abort();
	if (strchr(e.query, ';'))
		abort();
	code = ik_aws_kind_code(e.kind);
	if (code != IK_AWS_ERROR && !ik_outcome_by_code(code))
		abort();
	free(buf);
	return 0;
}
