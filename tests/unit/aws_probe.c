/* aws_probe SERVICE [TARGET [BODY [N [GAP_MS]]]]: opens an AWS client the
 * way the adapters do and prints where region, endpoint and credentials
 * came from (never the secret); with TARGET, makes the call (N times,
 * GAP_MS apart: a long-lived client, so credential refresh shows) and
 * prints each result.  With AWS_PROBE_INFLIGHT set, the N calls are
 * submitted at once (ik_aws_submit) and each result is printed as it is
 * reported, with its index: "call=I rc=...".  With AWS_PROBE_ABANDON
 * too, the client is closed while they are in flight (none may be
 * reported, nothing may leak: the sanitizer build checks).  Exit status: the open's or
 * the last failing call's code (IK_AWS_ERROR as 2). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "aws/aws.h"
#include "core/outcome.h"

static int last_rc = IK_OK;
static int reported;

static void
show(int i, int crc, cJSON *resp, const struct ik_aws_error *ae, const ik_err *err)
{
	char *s = resp ? cJSON_PrintUnformatted(resp) : NULL;

	if (i >= 0)
		printf("call=%d ", i);
	printf("rc=%d type=%s status=%ld\n", crc, ae->type, ae->status);
	if (crc != IK_OK) {
		printf("error=%s\n", err->msg);
		last_rc = crc;
	}
	if (s)
		printf("response=%s\n", s);
	free(s);
	cJSON_Delete(resp);
}

static void
on_done(void *arg, int crc, cJSON *resp, const struct ik_aws_error *ae, const ik_err *err)
{
	show((int)(long)arg, crc, resp, ae, err);
	reported++;
}

/* Submits n calls at once and runs them until each reported. */
static int
inflight(struct ik_aws *a, const char *target, const cJSON *req, int n)
{
	ik_err err = { 0 };
	int i, rc;

	for (i = 0; i < n; i++)
		if ((rc = ik_aws_submit(a, target, req, on_done, (void *)(long)i, &err)) != IK_OK) {
			printf("call=%d submit rc=%d error=%s\n", i, rc, err.msg);
			return rc;
		}
	printf("active=%zu\n", ik_aws_active(a));
	if (getenv("AWS_PROBE_ABANDON")) {
		if (ik_aws_run(a, NULL, 0, 0, &err) != IK_OK)
			return IK_SOFTWARE;
		printf("abandoned=%zu reported=%d\n", ik_aws_active(a), reported);
		return IK_OK;
	}
	while (ik_aws_active(a))
		if ((rc = ik_aws_run(a, NULL, 0, -1, &err)) != IK_OK) {
			printf("run rc=%d error=%s\n", rc, err.msg);
			return rc;
		}
	printf("reported=%d\n", reported);
	return last_rc;
}

int
main(int argc, char **argv)
{
	struct ik_aws *a;
	struct ik_aws_error ae;
	cJSON *req, *resp = NULL;
	ik_err err = { 0 };
	int rc = IK_OK, crc, i, n = argc > 4 ? atoi(argv[4]) : 1;
	long gap = argc > 5 ? atol(argv[5]) : 0;
	struct timespec ts = { gap / 1000, (gap % 1000) * 1000000L };

	if (argc < 2)
		return 64;
	if ((rc = ik_aws_open(argv[1], &a, &err)) != IK_OK) {
		fprintf(stderr, "open: %s\n", err.msg);
		return rc;
	}
	printf("source=%s region=%s endpoint=%s key=%s\n", ik_aws_cred_source(a),
	       ik_aws_region(a), ik_aws_endpoint(a), ik_aws_access_key_id(a));
	req = argc > 2 ? cJSON_Parse(argc > 3 ? argv[3] : "{}") : NULL;
	if (argc > 2 && getenv("AWS_PROBE_INFLIGHT"))
		rc = inflight(a, argv[2], req, n);
	for (i = 0; argc > 2 && !getenv("AWS_PROBE_INFLIGHT") && i < n; i++) {
		if (i)
			nanosleep(&ts, NULL);
		crc = ik_aws_call(a, argv[2], req, &resp, &ae, &err);
		show(-1, crc, resp, &ae, &err);
		resp = NULL;
		rc = last_rc;
	}
	cJSON_Delete(req);
	ik_aws_close(a);
	return rc == IK_AWS_ERROR ? 2 : rc;
}
