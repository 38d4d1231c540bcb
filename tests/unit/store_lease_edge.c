/* store_lease_edge: the lease boundary through the store port, with the
 * clock in the request (struct ik_claim_req.now_ms), so no clock hook is
 * needed in the product.  Usage: store_lease_edge STORE_URL KEY_PREFIX.
 *
 * Stores that run the lease on the worker's clock (sqlite, dynamodb): a
 * lease is live while now < leaseUntil, so a claim at exactly leaseUntil is
 * DUP_IN_PROGRESS and one at leaseUntil + 1 is ACQUIRED (attempt 2).
 *
 * postgres and redis: the server's clock decides and req->now_ms is not used for the
 * lease, so the boundary cannot be crafted from here.  What is checked
 * instead is what that buys: a worker whose clock runs an hour ahead (or
 * behind) still meets the live lease (DUP_IN_PROGRESS), and the leaseUntil
 * returned is the server's (within a minute of ours, not ours + skew).
 * Run by tests/store.bats on every backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/outcome.h"
#include "core/util.h"
#include "open/open_store.h"
#include "store/store.h"

#define FP "243d21ec76d04362e7f3f90d52ed9b52b45bf51641592c23ab31402081d37c46"
#define HOUR 3600000LL

static int failed, n;

static void
ok(int cond, const char *what, const struct ik_claim_res *res)
{
	n++;
	printf("%s %d - %s (code=%s attempt=%lld leaseUntil=%lld)\n", cond ? "ok" : "not ok", n,
	    what, ik_code_name(res->code), (long long)res->attempt, (long long)res->lease_until);
	failed |= !cond;
}

static int
claim(struct ik_store *s, const char *key, int64_t now, int64_t lease,
    struct ik_claim_res *res)
{
	char token[IK_TOKEN_HEX];
	struct ik_claim_req req = { .key = key, .fingerprint = FP, .event = "{}",
	                            .token = token, .now_ms = now, .lease_ms = lease,
	                            .expires_at = now / 1000 + 86400 };
	ik_err err = { 0 };
	int rc;

	ik_store_token(token);
	ik_record_free(&res->cur);
	memset(res, 0, sizeof *res);
	if ((rc = s->ops->claim(s, &req, res, &err)) != IK_OK)
		fprintf(stderr, "claim %s: %s\n", key, err.msg);
	return rc;
}

int
main(int argc, char **argv)
{
	struct ik_store *s;
	struct ik_claim_res res = { 0 };
	ik_err err = { 0 };
	char key[256];
	int64_t t0 = ik_now_ms(), until;

	if (argc != 3) {
		fprintf(stderr, "usage: store_lease_edge STORE_URL KEY_PREFIX\n");
		return 64;
	}
	/* Through the environment, as a worker gets it: a URL with a password
	 * is refused on a command line (ik_store_open's argv rule). */
	setenv("IDEMKIT_STORE", argv[1], 1);
	if (ik_store_open(NULL, &s, &err) != IK_OK) {
		fprintf(stderr, "open: %s\n", err.msg);
		return 1;
	}
	snprintf(key, sizeof key, "%s-edge", argv[2]);

	if (strcmp(s->ops->name, "postgres") != 0 && strcmp(s->ops->name, "redis") != 0) {
		ok(claim(s, key, t0, 5000, &res) == IK_OK && res.code == IK_OK &&
		   res.attempt == 1 && res.lease_until == t0 + 5000, "first claim", &res);
		until = res.lease_until;
		ok(claim(s, key, until - 1, 5000, &res) == IK_OK &&
		   res.code == IK_DUP_IN_PROGRESS && res.lease_until == until,
		   "at leaseUntil - 1: DUP_IN_PROGRESS", &res);
		ok(claim(s, key, until, 5000, &res) == IK_OK &&
		   res.code == IK_DUP_IN_PROGRESS && res.lease_until == until,
		   "at exactly leaseUntil: DUP_IN_PROGRESS (the lease is live while now < leaseUntil)",
		   &res);
		ok(claim(s, key, until + 1, 5000, &res) == IK_OK && res.code == IK_OK &&
		   res.attempt == 2 && res.lease_until == until + 1 + 5000,
		   "at leaseUntil + 1: ACQUIRED, attempt 2", &res);
	} else {
		ok(claim(s, key, t0, 60000, &res) == IK_OK && res.code == IK_OK &&
		   res.attempt == 1, "first claim", &res);
		until = res.lease_until;
		ok(until > t0 && until < t0 + 2 * 60000, "leaseUntil is the server's now + lease",
		   &res);
		ok(claim(s, key, t0 + HOUR, 60000, &res) == IK_OK &&
		   res.code == IK_DUP_IN_PROGRESS && res.lease_until == until,
		   "a worker clock an hour ahead: DUP_IN_PROGRESS (the server's clock decides)",
		   &res);
		ok(claim(s, key, t0 - HOUR, 60000, &res) == IK_OK &&
		   res.code == IK_DUP_IN_PROGRESS && res.lease_until == until,
		   "a worker clock an hour behind: DUP_IN_PROGRESS", &res);
	}
	ik_record_free(&res.cur);
	ik_store_close(s);
	puts(failed ? "FAILED" : "PASSED");
	return failed;
}
