/* aws_ini.c: the AWS CLI's shared files, read as the CLI reads them:
 * $AWS_CONFIG_FILE (default ~/.aws/config; sections "[profile NAME]" and
 * "[default]") and $AWS_SHARED_CREDENTIALS_FILE (default
 * ~/.aws/credentials; sections "[NAME]"), one profile merged from both,
 * the credentials file's values winning.
 *
 * Rules: a missing file is no profile, an unreadable one is IK_CONFIG
 * (never read as empty); indented lines belong to a nested block
 * ("s3 =\n  region = x") and are skipped; "#" and ";" start comments;
 * lines have no length limit; every value read is wiped when freed, as
 * any of them may be a secret.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aws/aws_int.h"
#include "core/lines.h"
#include "core/outcome.h"
#include "core/util.h"

static const char *const pkey_names[IK_AWS_P_N + 1] = {
	[IK_AWS_P_AK] = "aws_access_key_id",
	[IK_AWS_P_SK] = "aws_secret_access_key",
	[IK_AWS_P_TOK] = "aws_session_token",
	[IK_AWS_P_REGION] = "region",
	[IK_AWS_P_ROLE_ARN] = "role_arn",
	[IK_AWS_P_SOURCE_PROFILE] = "source_profile",
	[IK_AWS_P_CRED_SOURCE] = "credential_source",
	[IK_AWS_P_WEB_TOKEN_FILE] = "web_identity_token_file",
	[IK_AWS_P_SESSION_NAME] = "role_session_name",
	[IK_AWS_P_EXTERNAL_ID] = "external_id",
	[IK_AWS_P_DURATION] = "duration_seconds",
	[IK_AWS_P_PROCESS] = "credential_process",
	[IK_AWS_P_MFA_SERIAL] = "mfa_serial",
	[IK_AWS_P_SSO_SESSION] = "sso_session",
	[IK_AWS_P_SSO_START_URL] = "sso_start_url",
	[IK_AWS_P_SSO_ACCOUNT] = "sso_account_id",
	[IK_AWS_P_SSO_ROLE] = "sso_role_name",
	[IK_AWS_P_SSO_REGION] = "sso_region",
	[IK_AWS_P_LOGIN_SESSION] = "login_session",
	[IK_AWS_P_N] = NULL,
};

const char *
ik_aws_pkey_name(enum ik_aws_pkey k)
{
	return k < IK_AWS_P_N ? pkey_names[k] : "?";
}

char *
ik_aws_expand_home(const char *p)
{
	const char *home;
	struct ik_buf b = { 0 };

	if (p[0] == '~' && p[1] == '/' && (home = getenv("HOME"))) {
		ik_buf_addstr(&b, home);
		ik_buf_addstr(&b, p + 1);
		return b.p;
	}
	return ik_strdup(p);
}

static char *
default_file(const char *envname, const char *leaf)
{
	const char *v = getenv(envname), *home;
	struct ik_buf b = { 0 };

	if (v && *v)
		return ik_aws_expand_home(v);
	if (!(home = getenv("HOME")) || !*home)
		return NULL;
	ik_buf_addstr(&b, home);
	ik_buf_addstr(&b, "/.aws/");
	ik_buf_addstr(&b, leaf);
	return b.p;
}

static char *
trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* "[profile   x]" -> "profile x", in place; NULL when not a section line. */
static char *
section_name(char *s)
{
	char *e = strchr(s, ']'), *r, *w;
	int sp = 0;

	if (!e)
		return NULL;
	*e = '\0';
	for (r = w = trim(s + 1); *r; r++) {
		if (*r == ' ' || *r == '\t') {
			sp = 1;
			continue;
		}
		if (sp)
			*w++ = ' ';
		sp = 0;
		*w++ = *r;
	}
	*w = '\0';
	return trim(s + 1);
}

/* Read section sect (or alt) of the file at path into p, from_creds
 * marking where the values came from.  Returns 1 when the section exists,
 * 0 when it (or the file) does not, -1 on a read error (errno). */
static int
ini_read(const char *path, const char *sect, const char *alt, int from_creds,
         struct ik_aws_profile *p)
{
	struct ik_lines f;
	char *line, *s, *eq, *name, *val, *sn;
	size_t len;
	int fd, in = 0, found = 0, i, e, r;

	if (!path || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return path && errno != ENOENT && errno != ENOTDIR ? -1 : 0;
	ik_lines_init(&f, fd);
	while ((r = ik_lines_next(&f, &line, &len)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (line[0] == ' ' || line[0] == '\t')
			continue;            /* a nested block ("s3 =\n  x = y") */
		s = trim(line);
		if (*s == '#' || *s == ';' || !*s)
			continue;
		if (*s == '[') {
			if (!(sn = section_name(s)))
				continue;
			in = strcmp(sn, sect) == 0 || (alt && strcmp(sn, alt) == 0);
			found |= in;
			continue;
		}
		if (!in || !(eq = strchr(s, '=')))
			continue;
		*eq = '\0';
		name = trim(s);
		val = trim(eq + 1);
		for (i = 0; i < IK_AWS_P_N; i++)
			if (strcmp(name, pkey_names[i]) == 0 && *val) {
				ik_str_wipe_free(p->v[i]);
				p->v[i] = strdup(val);
				p->in_creds[i] = (unsigned char)from_creds;
			}
	}
	e = errno;
	ik_lines_free(&f);   /* wipes */
	close(fd);
	errno = e;
	return r < 0 ? -1 : found;
}

int
ik_aws_profile_load(const char *name, struct ik_aws_profile *p, ik_err *err)
{
	char *cfg = default_file("AWS_CONFIG_FILE", "config");
	char *cred = default_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
	struct ik_buf sect = { 0 };
	int r, rc = IK_OK;

	memset(p, 0, sizeof *p);
	ik_buf_addstr(&sect, "profile ");
	ik_buf_addstr(&sect, name);
	if (!(p->name = strdup(name)) || !sect.p) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	r = ini_read(cfg, sect.p, strcmp(name, "default") == 0 ? "default" : NULL, 0, p);
	if (r < 0) {
		rc = ik_errf(err, IK_CONFIG, "%s: cannot read: %s", cfg, strerror(errno));
		goto out;
	}
	p->found |= r;
	r = ini_read(cred, name, NULL, 1, p);
	if (r < 0) {
		rc = ik_errf(err, IK_CONFIG, "%s: cannot read: %s", cred, strerror(errno));
		goto out;
	}
	p->found |= r;
out:
	if (rc != IK_OK)
		ik_aws_profile_free(p);
	ik_buf_free(&sect);
	free(cfg);
	free(cred);
	return rc;
}

void
ik_aws_profile_free(struct ik_aws_profile *p)
{
	int i;

	for (i = 0; i < IK_AWS_P_N; i++)
		ik_str_wipe_free(p->v[i]);
	free(p->name);
	memset(p, 0, sizeof *p);
}
