/* aws_probe SERVICE [TARGET [BODY [N [GAP_MS]]]]: opens an AWS client the
 * way the adapters do and prints where region, endpoint and credentials
 * came from (never the secret); with TARGET, makes the call (N times,
 * GAP_MS apart: a long-lived client, so credential refresh shows) and
 * prints each result.  Exit status: the open's or the last failing
 * call's code (IK_AWS_ERROR as 2). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "aws.h"
#include "outcome.h"

int
main(int argc, char **argv)
{
	struct ik_aws *a;
	struct ik_aws_error ae;
	cJSON *req, *resp = NULL;
	ik_err err = { 0 };
	char *s;
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
	for (i = 0; argc > 2 && i < n; i++) {
		if (i)
			nanosleep(&ts, NULL);
		crc = ik_aws_call(a, argv[2], req, &resp, &ae, &err);
		s = resp ? cJSON_PrintUnformatted(resp) : NULL;
		printf("rc=%d type=%s status=%ld\n", crc, ae.type, ae.status);
		if (crc != IK_OK) {
			printf("error=%s\n", err.msg);
			rc = crc;
		}
		if (s)
			printf("response=%s\n", s);
		free(s);
		cJSON_Delete(resp);
		resp = NULL;
	}
	cJSON_Delete(req);
	ik_aws_close(a);
	return rc == IK_AWS_ERROR ? 2 : rc;
}
