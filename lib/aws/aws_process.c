/* aws_process.c: credential_process, as the AWS CLI runs it ("Sourcing
 * credentials with an external process"): a command whose standard output
 * is {"Version": 1, "AccessKeyId", "SecretAccessKey", "SessionToken"?,
 * "Expiration"?}.
 *
 * Rules: run by /bin/sh -c with standard input from /dev/null (the step's
 * stdin carries envelopes) and standard error ours; default signal
 * dispositions and an empty mask in the child; at most PROCESS_OUT_MAX
 * bytes in PROCESS_TIMEOUT_MS, else SIGKILL; exit status 75 is
 * IK_TEMPFAIL, any other failure or a malformed output IK_CONFIG; what it
 * printed is wiped.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "aws/aws_int.h"
#include "core/outcome.h"
#include "core/util.h"

#define PROCESS_TIMEOUT_MS 30000
#define PROCESS_OUT_MAX  65536

extern char **environ;

/* Run the command (by /bin/sh -c, stdin from /dev/null, stderr ours) and
 * read its JSON: {"Version": 1, "AccessKeyId", "SecretAccessKey",
 * "SessionToken"?, "Expiration"?}.  Exit status 75 is IK_TEMPFAIL, any
 * other failure IK_CONFIG; it gets PROCESS_TIMEOUT_MS, then SIGKILL. */
int
ik_aws_from_process(const char *cmd, struct ik_aws_creds *c, ik_err *err)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, dflt;
	char *argv[] = { "sh", "-c", (char *)cmd, NULL };
	struct ik_buf out = { 0 };
	char chunk[4096];
	int fds[2], rc = IK_OK, status, version_ok, e;
	int64_t deadline = ik_mono_ms() + PROCESS_TIMEOUT_MS, left;
	struct pollfd pf;
	ssize_t n;
	pid_t pid;
	cJSON *j = NULL, *v, *ak, *sk, *tok, *exp;

	if (ik_cloexec_pipe(fds, 0) < 0)
		return ik_errf(err, IK_SOFTWARE, "credential_process: pipe: %s", strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	sigemptyset(&dflt);
	sigaddset(&dflt, SIGPIPE);
	sigaddset(&dflt, SIGINT);
	sigaddset(&dflt, SIGTERM);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &dflt);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	e = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(fds[1]);
	if (e) {
		close(fds[0]);
		return ik_errf(err, IK_CONFIG, "credential_process: cannot run /bin/sh: %s",
		               strerror(e));
	}
	pf.fd = fds[0];
	pf.events = POLLIN;
	for (;;) {
		if ((left = deadline - ik_mono_ms()) <= 0) {
			rc = ik_errf(err, IK_TEMPFAIL, "credential_process: no answer in %d s",
			             PROCESS_TIMEOUT_MS / 1000);
			kill(pid, SIGKILL);
			break;
		}
		if (poll(&pf, 1, (int)left) < 0) {
			if (errno == EINTR)
				continue;
			rc = ik_errf(err, IK_SOFTWARE, "credential_process: poll: %s", strerror(errno));
			kill(pid, SIGKILL);
			break;
		}
		if ((n = read(fds[0], chunk, sizeof chunk)) < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			rc = ik_errf(err, IK_SOFTWARE, "credential_process: read: %s", strerror(errno));
			kill(pid, SIGKILL);
			break;
		}
		if (n == 0)
			break;
		if (out.len + (size_t)n > PROCESS_OUT_MAX || ik_buf_add(&out, chunk, (size_t)n) < 0) {
			rc = ik_errf(err, IK_CONFIG, "credential_process: output larger than %d bytes",
			             PROCESS_OUT_MAX);
			kill(pid, SIGKILL);
			break;
		}
	}
	sodium_memzero(chunk, sizeof chunk);
	close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (rc != IK_OK)
		goto out;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		if (WIFEXITED(status))
			rc = ik_errf(err, WEXITSTATUS(status) == IK_TEMPFAIL ? IK_TEMPFAIL : IK_CONFIG,
			             "credential_process exited %d", WEXITSTATUS(status));
		else
			rc = ik_errf(err, IK_CONFIG, "credential_process killed by signal %d",
			             WTERMSIG(status));
		goto out;
	}
	j = out.p ? cJSON_ParseWithLength(out.p, out.len) : NULL;
	v = cJSON_GetObjectItemCaseSensitive(j, "Version");
	ak = cJSON_GetObjectItemCaseSensitive(j, "AccessKeyId");
	sk = cJSON_GetObjectItemCaseSensitive(j, "SecretAccessKey");
	tok = cJSON_GetObjectItemCaseSensitive(j, "SessionToken");
	exp = cJSON_GetObjectItemCaseSensitive(j, "Expiration");
	version_ok = cJSON_IsNumber(v) && v->valuedouble == 1;
	if (!cJSON_IsObject(j) || !version_ok) {
		rc = ik_errf(err, IK_CONFIG, "credential_process: output is not JSON with \"Version\": 1");
		goto out;
	}
	if (!cJSON_IsString(ak) || !cJSON_IsString(sk) || !*ak->valuestring || !*sk->valuestring) {
		rc = ik_errf(err, IK_CONFIG, "credential_process: output without "
		             "AccessKeyId/SecretAccessKey");
		goto out;
	}
	if (exp && (!cJSON_IsString(exp) || ik_aws_parse_time_ms(exp->valuestring) < 0)) {
		rc = ik_errf(err, IK_CONFIG, "credential_process: Expiration is not an ISO 8601 time");
		goto out;
	}
	if ((rc = ik_aws_creds_set(c, ak->valuestring, sk->valuestring,
	                    cJSON_IsString(tok) ? tok->valuestring : NULL, err)) != IK_OK)
		goto out;
	c->expires_ms = exp ? ik_aws_parse_time_ms(exp->valuestring) : 0;
out:
	if (j) {
		if (cJSON_IsString(sk = cJSON_GetObjectItemCaseSensitive(j, "SecretAccessKey")))
			sodium_memzero(sk->valuestring, strlen(sk->valuestring));
		if (cJSON_IsString(tok = cJSON_GetObjectItemCaseSensitive(j, "SessionToken")))
			sodium_memzero(tok->valuestring, strlen(tok->valuestring));
	}
	cJSON_Delete(j);
	ik_buf_wipe_free(&out);
	return rc;
}
