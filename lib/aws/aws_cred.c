/* aws_cred.c: the AWS credential chain: its order, what it refuses, and
 * refreshing from the same source.
 *
 * The order is the AWS CLI's ("Configuration and credential file
 * settings", precedence), and the first source that applies is the only
 * one tried:
 *   1. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY [/ AWS_SESSION_TOKEN];
 *   2. the profile's role_arn with source_profile or credential_source:
 *      STS AssumeRole signed with the source's credentials (chains of
 *      source profiles are followed, up to MAX_DEPTH);
 *   3. web identity: AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, else the
 *      profile's web_identity_token_file + role_arn: STS
 *      AssumeRoleWithWebIdentity, unsigned;
 *   4. the profile's static keys in the credentials file;
 *   5. the profile's credential_process (JSON, Version 1);
 *   6. the profile's static keys in the config file;
 *   7. container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, or
 *      _FULL_URI to a loopback or the documented ECS/EKS address, with
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]);
 *   8. EC2 IMDSv2, unless AWS_EC2_METADATA_DISABLED=true.
 *
 * Rules:
 *  - never a different principal silently: a profile that names a method
 *    idemkit does not follow (IAM Identity Center sso_*, login_session,
 *    mfa_serial, an unknown credential_source, a role_arn with no source)
 *    is IK_CONFIG naming the setting, never a fall-through to container
 *    or instance credentials; so is AWS_PROFILE naming no profile, a
 *    source that applies but fails, and a half-set pair of variables;
 *  - credentials are refreshed from the same source they came from;
 *  - they live only in struct ik_aws_creds and never reach a message or
 *    a log line.
 * The providers that talk to something live apart: aws_sts.c (STS),
 * aws_meta.c (container, IMDS), aws_process.c (credential_process).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "aws/aws_int.h"
#include "core/log.h"
#include "core/outcome.h"
#include "core/util.h"

#define CRED_REFRESH_MS  (10 * 60 * 1000)  /* refresh this long before expiry */
#define MAX_DEPTH        5                 /* source_profile hops */

enum src {
	SRC_ENV, SRC_ASSUME_ROLE, SRC_WEB_IDENTITY, SRC_SHARED, SRC_PROCESS,
	SRC_CONFIG, SRC_CONTAINER, SRC_IMDS,
};

static const char *const src_names[] = {
	"env", "assume-role", "web-identity", "shared-credentials-file",
	"credential-process", "config-file", "container", "imds",
};

/* What it takes to fetch the credentials again: the kind, and for the
 * profile-based kinds the profile (re-read at each refresh). */
struct ik_aws_src {
	enum src kind;
	char *profile;    /* NULL: from the environment */
};

static int
oom(ik_err *err)
{
	return ik_errf(err, IK_SOFTWARE, "out of memory");
}

/* ---- static keys -------------------------------------------------------
 * Each provider returns IK_OK with *c filled, IK_EMPTY when it does not
 * apply, or an error code that ends the chain. */

static int
from_env(struct ik_aws_creds *c, ik_err *err)
{
	const char *ak = ik_aws_env("AWS_ACCESS_KEY_ID"), *sk = ik_aws_env("AWS_SECRET_ACCESS_KEY");

	if (!ak && !sk)
		return IK_EMPTY;
	if (!ak || !sk)
		return ik_errf(err, IK_CONFIG, "%s is set but %s is not",
		               ak ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
		               ak ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
	return ik_aws_creds_set(c, ak, sk, ik_aws_env("AWS_SESSION_TOKEN"), err);
}

/* The profile's static keys, from the credentials file (creds = 1) or
 * the config file (creds = 0). */
static int
from_profile_keys(const struct ik_aws_profile *p, int creds, struct ik_aws_creds *c,
                  ik_err *err)
{
	const char *ak = p->v[IK_AWS_P_AK], *sk = p->v[IK_AWS_P_SK];

	if (!(ak && p->in_creds[IK_AWS_P_AK] == creds) &&
	    !(sk && p->in_creds[IK_AWS_P_SK] == creds))
		return IK_EMPTY;
	if (!ak || !sk)
		return ik_errf(err, IK_CONFIG, "AWS profile %s has %s but not %s", p->name,
		               ak ? "aws_access_key_id" : "aws_secret_access_key",
		               ak ? "aws_secret_access_key" : "aws_access_key_id");
	return ik_aws_creds_set(c, ak, sk, p->v[IK_AWS_P_TOK], err);
}

/* ---- profiles --------------------------------------------------------- */

/* The settings that name a method idemkit does not follow. */
static int
refused(const struct ik_aws_profile *p, ik_err *err)
{
	static const enum ik_aws_pkey sso[] = {
		IK_AWS_P_SSO_SESSION, IK_AWS_P_SSO_START_URL, IK_AWS_P_SSO_ACCOUNT,
		IK_AWS_P_SSO_ROLE, IK_AWS_P_SSO_REGION,
	};
	const char *cs = p->v[IK_AWS_P_CRED_SOURCE];
	size_t i;

	for (i = 0; i < sizeof sso / sizeof sso[0]; i++)
		if (p->v[sso[i]])
			return ik_errf(err, IK_CONFIG, "AWS profile %s uses IAM Identity Center "
			               "(%s), which idemkit does not support; give the worker "
			               "a role (container, instance, web identity) or keys",
			               p->name, ik_aws_pkey_name(sso[i]));
	if (p->v[IK_AWS_P_LOGIN_SESSION])
		return ik_errf(err, IK_CONFIG, "AWS profile %s uses login_session, which "
		               "idemkit does not support", p->name);
	if (p->v[IK_AWS_P_MFA_SERIAL] && p->v[IK_AWS_P_ROLE_ARN])
		return ik_errf(err, IK_CONFIG, "AWS profile %s needs an MFA code (mfa_serial), "
		               "which a worker cannot type", p->name);
	if (cs && strcmp(cs, "Environment") != 0 && strcmp(cs, "Ec2InstanceMetadata") != 0 &&
	    strcmp(cs, "EcsContainer") != 0)
		return ik_errf(err, IK_CONFIG, "AWS profile %s: credential_source %.64s is not "
		               "one of Environment, Ec2InstanceMetadata, EcsContainer", p->name, cs);
	if (p->v[IK_AWS_P_ROLE_ARN] && p->v[IK_AWS_P_SOURCE_PROFILE] && cs)
		return ik_errf(err, IK_CONFIG, "AWS profile %s has both source_profile and "
		               "credential_source", p->name);
	if (p->v[IK_AWS_P_ROLE_ARN] && !p->v[IK_AWS_P_SOURCE_PROFILE] && !cs &&
	    !p->v[IK_AWS_P_WEB_TOKEN_FILE])
		return ik_errf(err, IK_CONFIG, "AWS profile %s has role_arn but no "
		               "source_profile, credential_source or web_identity_token_file",
		               p->name);
	if (!p->v[IK_AWS_P_ROLE_ARN] && (cs || p->v[IK_AWS_P_SOURCE_PROFILE]))
		return ik_errf(err, IK_CONFIG, "AWS profile %s has %s but no role_arn", p->name,
		               cs ? "credential_source" : "source_profile");
	return IK_OK;
}

static int profile_creds(const struct ik_aws_cfg *a, const struct ik_aws_profile *p,
                         int depth, int top, enum src *kind, struct ik_aws_creds *c,
                         ik_err *err);

/* The credentials a role's source stands for: credential_source, or the
 * source profile followed as a profile of its own (its role_arn too, so
 * role chains work), except that a profile that is its own source uses
 * its static keys. */
static int
source_creds(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, int depth,
             struct ik_aws_creds *c, ik_err *err)
{
	const char *cs = p->v[IK_AWS_P_CRED_SOURCE], *sp = p->v[IK_AWS_P_SOURCE_PROFILE];
	struct ik_aws_profile src;
	enum src kind;
	int rc;

	if (cs) {
		if (strcmp(cs, "Environment") == 0)
			rc = from_env(c, err);
		else if (strcmp(cs, "EcsContainer") == 0)
			rc = ik_aws_from_container(a, c, err);
		else
			rc = ik_aws_from_imds(a, c, err);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_CONFIG, "credential_source %s: no credentials there", cs);
		return rc;
	}
	if (depth >= MAX_DEPTH)
		return ik_errf(err, IK_CONFIG, "source_profile %s: more than %d roles in a chain "
		               "(or a loop)", sp, MAX_DEPTH);
	if (strcmp(sp, p->name) == 0) {
		rc = from_profile_keys(p, 1, c, err);
		if (rc == IK_EMPTY)
			rc = from_profile_keys(p, 0, c, err);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_CONFIG, "AWS profile %s is its own source_profile but "
			             "has no keys", sp);
		return rc;
	}
	if ((rc = ik_aws_profile_load(sp, &src, err)) != IK_OK)
		return rc;
	if (!src.found)
		rc = ik_errf(err, IK_CONFIG, "source_profile %s not found", sp);
	else if ((rc = profile_creds(a, &src, depth + 1, 0, &kind, c, err)) == IK_EMPTY)
		rc = ik_errf(err, IK_CONFIG, "source_profile %s has no credentials", sp);
	ik_aws_profile_free(&src);
	return rc;
}

static int
assume_role(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, int depth,
            struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_creds s = { 0 };
	long long secs;
	int rc;

	if (p->v[IK_AWS_P_DURATION] &&
	    ik_parse_int(p->v[IK_AWS_P_DURATION], 900, 43200, &secs) < 0)
		return ik_errf(err, IK_CONFIG, "AWS profile %s: duration_seconds: want 900 to "
		               "43200", p->name);
	if ((rc = source_creds(a, p, depth, &s, err)) == IK_OK)
		rc = ik_aws_sts_assume_role(a, p->v[IK_AWS_P_ROLE_ARN], p->v[IK_AWS_P_SESSION_NAME],
		                            p->v[IK_AWS_P_EXTERNAL_ID], p->v[IK_AWS_P_DURATION],
		                            &s, c, err);
	if (rc != IK_OK)
		ik_errwrap(err, "AWS profile %s", p->name);
	ik_aws_creds_free(&s);
	return rc;
}

/* What profile p names, in the CLI's order; IK_EMPTY when it names
 * nothing (the chain goes on).  top: the selected profile, where the
 * environment's web identity sits between role_arn and the rest. */
static int
profile_creds(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, int depth,
              int top, enum src *kind, struct ik_aws_creds *c, ik_err *err)
{
	const char *wtf = ik_aws_env("AWS_WEB_IDENTITY_TOKEN_FILE"), *wrole = ik_aws_env("AWS_ROLE_ARN");
	int rc;

	if ((rc = refused(p, err)) != IK_OK)
		return rc;
	if (p->v[IK_AWS_P_ROLE_ARN] && (p->v[IK_AWS_P_SOURCE_PROFILE] ||
	                                p->v[IK_AWS_P_CRED_SOURCE])) {
		*kind = SRC_ASSUME_ROLE;
		return assume_role(a, p, depth, c, err);
	}
	if (top && (wtf || wrole)) {
		if (!wtf || !wrole)
			return ik_errf(err, IK_CONFIG, "%s is set but %s is not",
			               wtf ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN",
			               wtf ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE");
		*kind = SRC_WEB_IDENTITY;
		if ((rc = ik_aws_sts_web_identity(a, wtf, wrole, ik_aws_env("AWS_ROLE_SESSION_NAME"), c, err)) != IK_OK)
			ik_errwrap(err, "AWS_ROLE_ARN");
		return rc;
	}
	if (p->v[IK_AWS_P_ROLE_ARN]) {      /* with web_identity_token_file (refused() checked) */
		*kind = SRC_WEB_IDENTITY;
		if ((rc = ik_aws_sts_web_identity(a, p->v[IK_AWS_P_WEB_TOKEN_FILE], p->v[IK_AWS_P_ROLE_ARN],
		                       p->v[IK_AWS_P_SESSION_NAME], c, err)) != IK_OK)
			ik_errwrap(err, "AWS profile %s", p->name);
		return rc;
	}
	*kind = SRC_SHARED;
	if ((rc = from_profile_keys(p, 1, c, err)) != IK_EMPTY)
		return rc;
	if (p->v[IK_AWS_P_PROCESS]) {
		*kind = SRC_PROCESS;
		if ((rc = ik_aws_from_process(p->v[IK_AWS_P_PROCESS], c, err)) != IK_OK)
			ik_errwrap(err, "AWS profile %s", p->name);
		return rc;
	}
	*kind = SRC_CONFIG;
	return from_profile_keys(p, 0, c, err);
}

/* ---- the chain -------------------------------------------------------- */

static int
run(const struct ik_aws_cfg *a, const struct ik_aws_profile *p, enum src *kind,
    struct ik_aws_creds *c, ik_err *err)
{
	int rc, env_is_source;

	memset(c, 0, sizeof *c);
	*kind = SRC_ENV;
	/* a profile chosen by AWS_PROFILE whose role takes the variables as
	 * its source: the role, not the variables' own principal */
	env_is_source = a->profile_explicit && p->v[IK_AWS_P_ROLE_ARN] &&
	                p->v[IK_AWS_P_CRED_SOURCE] &&
	                strcmp(p->v[IK_AWS_P_CRED_SOURCE], "Environment") == 0;
	if (!env_is_source && (rc = from_env(c, err)) != IK_EMPTY) {
		if (rc == IK_OK && a->profile_explicit)
			ik_log(IK_LOG_WARN, "AWS_ACCESS_KEY_ID is set: it wins over AWS_PROFILE, "
			       "as in the AWS CLI", "profile", a->profile, NULL);
		return rc;
	}
	if (a->profile_explicit && !p->found)
		return ik_errf(err, IK_CONFIG, "AWS profile %s not found in the "
		               "credentials or config file", a->profile);
	if ((rc = profile_creds(a, p, 0, 1, kind, c, err)) != IK_EMPTY)
		return rc;
	*kind = SRC_CONTAINER;
	if ((rc = ik_aws_from_container(a, c, err)) != IK_EMPTY)
		return rc;
	*kind = SRC_IMDS;
	if ((rc = ik_aws_from_imds(a, c, err)) != IK_EMPTY)
		return rc;
	return ik_errf(err, IK_CONFIG, "no AWS credentials: set AWS_ACCESS_KEY_ID and "
	               "AWS_SECRET_ACCESS_KEY, a profile in ~/.aws/credentials, or run "
	               "with web identity, container or instance credentials");
}

int
ik_aws_creds_load(const struct ik_aws_cfg *a, const struct ik_aws_profile *p,
                  struct ik_aws_src **srcp, struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_src *src;
	enum src kind;
	int rc;

	*srcp = NULL;
	if ((rc = run(a, p, &kind, c, err)) != IK_OK) {
		ik_aws_creds_free(c);
		return rc;
	}
	if (!(src = calloc(1, sizeof *src)) ||
	    (kind != SRC_ENV && kind != SRC_CONTAINER && kind != SRC_IMDS &&
	     !(src->profile = strdup(p->name)))) {
		free(src);
		ik_aws_creds_free(c);
		return oom(err);
	}
	src->kind = kind;
	c->fetched_ms = ik_now_ms();
	*srcp = src;
	return IK_OK;
}

/* The same source again: its profile re-read (files may have been
 * rotated), never another link of the chain. */
static int
again(const struct ik_aws_cfg *a, const struct ik_aws_src *src, struct ik_aws_creds *c,
      ik_err *err)
{
	struct ik_aws_profile p;
	enum src kind;
	int rc;

	if (src->kind == SRC_CONTAINER)
		return ik_aws_from_container(a, c, err);
	if (src->kind == SRC_IMDS)
		return ik_aws_from_imds(a, c, err);
	if (!src->profile)
		return IK_EMPTY;
	if ((rc = ik_aws_profile_load(src->profile, &p, err)) != IK_OK)
		return rc;
	rc = profile_creds(a, &p, 0, 1, &kind, c, err);
	if (rc == IK_OK && kind != src->kind) {
		ik_aws_creds_free(c);
		rc = ik_errf(err, IK_CONFIG, "AWS profile %s now names %s instead of %s",
		             src->profile, src_names[kind], src_names[src->kind]);
	}
	ik_aws_profile_free(&p);
	return rc;
}

int
ik_aws_creds_refresh(const struct ik_aws_cfg *a, struct ik_aws_src *src,
                     struct ik_aws_creds *c, ik_err *err)
{
	struct ik_aws_creds n = { 0 };
	int64_t now = ik_now_ms(), margin;
	int rc;

	if (!c->expires_ms)
		return IK_OK;
	margin = (c->expires_ms - c->fetched_ms) / 2;
	if (margin > CRED_REFRESH_MS || margin < 0)
		margin = CRED_REFRESH_MS;
	if (now < c->expires_ms - margin)
		return IK_OK;
	rc = again(a, src, &n, err);
	if (rc != IK_OK) {
		ik_aws_creds_free(&n);
		if (rc == IK_EMPTY)
			rc = ik_errf(err, IK_TEMPFAIL, "%s: not reachable", src_names[src->kind]);
		if (now < c->expires_ms) {
			ik_log(IK_LOG_WARN, "AWS credentials refresh failed; the current ones "
			       "are still valid", "source", src_names[src->kind],
			       IK_LOG_NUM("validMs", c->expires_ms - now),
			       "error", err ? err->msg : "", NULL);
			ik_errclear(err);
			return IK_OK;
		}
		return ik_errwrap(err, "refreshing expired %s credentials", src_names[src->kind]);
	}
	ik_log(IK_LOG_DEBUG, "AWS credentials refreshed", "source", src_names[src->kind],
	       "key", n.ak, NULL);
	ik_aws_creds_free(c);
	*c = n;
	c->fetched_ms = now;
	return IK_OK;
}

const char *
ik_aws_src_name(const struct ik_aws_src *src)
{
	return src_names[src->kind];
}

void
ik_aws_src_free(struct ik_aws_src *src)
{
	if (src) {
		free(src->profile);
		free(src);
	}
}
