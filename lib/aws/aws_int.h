/* aws_int.h: what the files of the AWS client share, and nothing else
 * includes (the rest of idemkit sees aws.h only).
 *
 *   aws.c        the client: settings, endpoint, ik_aws_call
 *   aws_retry.c  the standard retry mode: attempts, full-jitter backoff
 *   aws_err.c    the error classifier (pure)
 *   aws_ini.c    the shared config and credentials files
 *   aws_cred.c   the credential chain: its order, refusals and refresh
 *   aws_keys.c   the credentials as every source fills them
 *   aws_sts.c    STS AssumeRole and AssumeRoleWithWebIdentity
 *   aws_meta.c   container credentials and EC2 IMDSv2
 *   aws_process.c  credential_process
 *
 * Rule: credentials live only in struct ik_aws_creds and are wiped when
 * replaced or freed; no file of these puts one in a message or a log.
 */
#ifndef IK_AWS_INT_H
#define IK_AWS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "aws/aws.h"
#include "conn/http.h"
#include "core/err.h"

#define IK_AWS_SECRET_FILE_MAX 16384   /* a token file larger than this is refused */

struct ik_aws_creds {
	char *ak, *sk, *tok;
	int64_t expires_ms;      /* 0: does not expire */
	int64_t fetched_ms;      /* when they were obtained */
};
/* aws_keys.c: */
void ik_aws_creds_free(struct ik_aws_creds *c);   /* wipes; c reusable */
/* Copies into c (tok may be NULL or ""); IK_OK or IK_SOFTWARE. */
int ik_aws_creds_set(struct ik_aws_creds *c, const char *ak, const char *sk,
                     const char *tok, ik_err *err);
/* getenv, with "" as unset. */
const char *ik_aws_env(const char *name);
/* "2026-12-01T10:00:00Z" (fractions ignored) -> epoch ms; -1 when malformed. */
int64_t ik_aws_parse_time_ms(const char *s);

/* Settings ik_aws_open resolves once, used by every file here. */
struct ik_aws_cfg {
	const char *region;
	const char *profile;        /* AWS_PROFILE, AWS_DEFAULT_PROFILE, "default" */
	int profile_explicit;       /* AWS_PROFILE was set */
	const char *cacert;         /* AWS_CA_BUNDLE, or NULL */
	int max_attempts;           /* AWS_MAX_ATTEMPTS */
	int64_t backoff_cap_ms;
	long timeout_ms;            /* IDEMKIT_AWS_TIMEOUT */
	struct ik_http *http;
};

/* ---- aws_err.c -------------------------------------------------------- */

/* The first line of s[0..n), control characters as spaces, bounded by outsz. */
void ik_aws_copy_line(char *out, size_t outsz, const char *s, size_t n);
/* The text of the first <tag>...</tag> in body[0..len), or NULL; *n is its
 * length.  For the query protocol's flat documents (STS). */
const char *ik_aws_xml_text(const char *body, size_t len, const char *tag, size_t *n);

/* ---- aws_retry.c ------------------------------------------------------ */

/* The backoff before try n+1 is ik_backoff_jitter(IK_AWS_BACKOFF_BASE_MS,
 * cap, n-1) (util.h): uniform in [0, min(cap, 50 ms * 2^(n-1))]. */
#define IK_AWS_BACKOFF_BASE_MS 50
/* One try's transport result (rc, res, herr as ik_http_do gives them)
 * into e: an HTTP answer is classified, a transient transport failure is
 * IK_AWS_TRANSIENT (retryable) with herr's message.  Returns rc. */
int ik_aws_judge(int rc, const struct ik_http_res *res, const ik_err *herr,
                 struct ik_aws_error *e);
/* After try attempt was judged into e: the backoff in ms before the next
 * try, or -1 when there is none (not retryable, or the attempts are
 * spent).  Logs the retry at debug level. */
int64_t ik_aws_retry_wait_ms(const struct ik_aws_cfg *cfg, const char *what,
                             const struct ik_aws_error *e, int attempt);
/* Send req up to cfg->max_attempts times while the answer (classified into
 * e) is retryable or the transport failed transiently, sleeping the
 * backoff between tries.  IK_OK when an answer that is not retryable came
 * (e->kind says which), or the retryable one that outlasted the attempts;
 * IK_TEMPFAIL when the last try got no answer (e says why); IK_CONFIG or
 * IK_SOFTWARE from the transport at once.  *tries counts the requests
 * sent.  what ("dynamodb PutItem") names the call in debug logs. */
int ik_aws_send(const struct ik_aws_cfg *cfg, const char *what,
                const struct ik_http_req *req, struct ik_http_res *res,
                struct ik_aws_error *e, int *tries, ik_err *err);

/* ---- aws_ini.c -------------------------------------------------------- */

/* The keys of a profile idemkit reads.  Some name a method idemkit does
 * not support: aws_cred.c refuses them rather than skip them. */
enum ik_aws_pkey {
	IK_AWS_P_AK, IK_AWS_P_SK, IK_AWS_P_TOK, IK_AWS_P_REGION,
	IK_AWS_P_ROLE_ARN, IK_AWS_P_SOURCE_PROFILE, IK_AWS_P_CRED_SOURCE,
	IK_AWS_P_WEB_TOKEN_FILE, IK_AWS_P_SESSION_NAME, IK_AWS_P_EXTERNAL_ID,
	IK_AWS_P_DURATION, IK_AWS_P_PROCESS, IK_AWS_P_MFA_SERIAL,
	IK_AWS_P_SSO_SESSION, IK_AWS_P_SSO_START_URL, IK_AWS_P_SSO_ACCOUNT,
	IK_AWS_P_SSO_ROLE, IK_AWS_P_SSO_REGION, IK_AWS_P_LOGIN_SESSION,
	IK_AWS_P_N
};
const char *ik_aws_pkey_name(enum ik_aws_pkey k);

/* One profile, merged as the AWS CLI merges it: the config file's
 * [profile NAME] ([default] for the default), then the credentials file's
 * [NAME], whose values win. */
struct ik_aws_profile {
	char *name;
	char *v[IK_AWS_P_N];              /* malloc'd values or NULL */
	unsigned char in_creds[IK_AWS_P_N]; /* the value came from the credentials file */
	int found;                         /* a section in either file */
};
/* IK_OK (p->found says whether it exists), IK_CONFIG when a file exists
 * but cannot be read, IK_SOFTWARE. */
int ik_aws_profile_load(const char *name, struct ik_aws_profile *p, ik_err *err);
void ik_aws_profile_free(struct ik_aws_profile *p);   /* wipes the values */

/* "~/x" -> "$HOME/x"; malloc'd. */
char *ik_aws_expand_home(const char *path);

/* ---- providers: IK_OK with *c filled, IK_EMPTY when the source is not
 * configured, or the error that ends the chain ---------------------------- */

/* aws_meta.c: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI. */
int ik_aws_from_container(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err);
/* aws_meta.c: IMDSv2, unless AWS_EC2_METADATA_DISABLED=true. */
int ik_aws_from_imds(const struct ik_aws_cfg *a, struct ik_aws_creds *c, ik_err *err);
/* aws_process.c: run cmd, read its Version 1 JSON. */
int ik_aws_from_process(const char *cmd, struct ik_aws_creds *c, ik_err *err);
/* aws_sts.c: AssumeRole signed by signer; sess, external_id, duration may
 * be NULL. */
int ik_aws_sts_assume_role(const struct ik_aws_cfg *a, const char *role, const char *sess,
                           const char *external_id, const char *duration,
                           const struct ik_aws_creds *signer, struct ik_aws_creds *c,
                           ik_err *err);
/* aws_sts.c: AssumeRoleWithWebIdentity with the token in tokfile (read
 * now), unsigned. */
int ik_aws_sts_web_identity(const struct ik_aws_cfg *a, const char *tokfile, const char *role,
                            const char *sess, struct ik_aws_creds *c, ik_err *err);

/* ---- aws_cred.c ------------------------------------------------------- */

/* Where credentials came from (ik_aws_src_name gives the name aws.h
 * documents) and what it takes to get them again. */
struct ik_aws_src;

/* The chain, in the AWS CLI's order.  IK_OK with *c and *src filled;
 * IK_CONFIG (nothing found, a refused method, a bad setting), IK_TEMPFAIL
 * (a credential endpoint unreachable). */
int ik_aws_creds_load(const struct ik_aws_cfg *cfg, const struct ik_aws_profile *prof,
                      struct ik_aws_src **src, struct ik_aws_creds *c, ik_err *err);
/* Temporary credentials are fetched again from the same source when they
 * are close to expiry (10 min before, or after half their lifetime when
 * that is shorter); a failed refresh keeps the old ones while they are
 * valid.  IK_OK, or the refresh's code once they have expired. */
int ik_aws_creds_refresh(const struct ik_aws_cfg *cfg, struct ik_aws_src *src,
                         struct ik_aws_creds *c, ik_err *err);
const char *ik_aws_src_name(const struct ik_aws_src *src);
void ik_aws_src_free(struct ik_aws_src *src);

#endif
