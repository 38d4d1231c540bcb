/* aws_probe SERVICE [TARGET [BODY]]: opens an AWS client the way the
 * adapters do and prints where region, endpoint and credentials came from
 * (never the secret); with TARGET, makes one call and prints its result.
 * Exit status: the open's or the call's code (IK_AWS_ERROR as 2). */
#include <stdio.h>
#include <stdlib.h>

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
	int rc;

	if (argc < 2)
		return 64;
	if ((rc = ik_aws_open(argv[1], &a, &err)) != IK_OK) {
		fprintf(stderr, "open: %s\n", err.msg);
		return rc;
	}
	printf("source=%s region=%s endpoint=%s key=%s\n", ik_aws_cred_source(a),
	       ik_aws_region(a), ik_aws_endpoint(a), ik_aws_access_key_id(a));
	if (argc > 2) {
		req = cJSON_Parse(argc > 3 ? argv[3] : "{}");
		rc = ik_aws_call(a, argv[2], req, &resp, &ae, &err);
		s = resp ? cJSON_PrintUnformatted(resp) : NULL;
		printf("rc=%d type=%s status=%ld\n", rc, ae.type, ae.status);
		if (rc != IK_OK)
			printf("error=%s\n", err.msg);
		if (s)
			printf("response=%s\n", s);
		free(s);
		cJSON_Delete(resp);
		cJSON_Delete(req);
	}
	ik_aws_close(a);
	return rc == IK_AWS_ERROR ? 2 : rc;
}
