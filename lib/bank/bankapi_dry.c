/* bankapi_dry.c: --dry-run of charge-debit and charge-notify: the request
 * a command would send for one envelope, built by the same code that
 * sends it (bankapi.c), shown and never sent.  No store is opened and no
 * lease checked: it is for mapping a new bank, not for a claimed charge. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bank/bankapi.h"
#include "core/envelope.h"
#include "core/lines.h"
#include "core/outcome.h"
#include "core/util.h"

int
ik_bankapi_cli_dry_run(struct ik_bankapi *a, struct ik_bankapi_cli *c, int fd,
                       const char *suffix, char **out, ik_err *err)
{
	struct ik_lines in;
	struct ik_event ev;
	struct ik_buf key = {0};
	cJSON *env = NULL;
	const char *body, *ref = NULL;
	char *line, *req = NULL;
	size_t len;
	int r, rc;

	*out = NULL;
	ik_lines_init(&in, fd);
	do
		r = ik_lines_next(&in, &line, &len);
	while (r < 0 && errno == EINTR && !ik_stop_signal);
	if (r <= 0) {
		rc = r == 0 ? ik_errf(err, IK_DATAERR, "--dry-run: no envelope or event on stdin")
		            : ik_errf(err, IK_SOFTWARE, "stdin: %s", strerror(errno));
		goto out;
	}
	if ((rc = ik_env_parse(line, len, &env, err)) != IK_OK)
		goto out;
	body = ik_env_body(env);
	if ((rc = ik_event_parse(body, strlen(body), &ev, err)) != IK_OK)
		goto out;
	if ((rc = ik_bankapi_open(a, &c->opts, err)) != IK_OK)
		goto out;
	/* The notification's key and ref, as charge-notify makes them. */
	if (*suffix)
		ref = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
			ik_env_result(env, "debit"), "ref"));
	if (ik_buf_addstr(&key, ev.charge_id) < 0 || ik_buf_addstr(&key, suffix) < 0) {
		rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		goto out;
	}
	if ((rc = ik_bankapi_body(a, body, &ev, key.p,
	    cJSON_GetObjectItemCaseSensitive(ik_env_result(env, "claim"), "attempt"),
	    ref, &req, err)) != IK_OK)
		goto out;
	rc = ik_bankapi_dry_run(a, key.p, req, out, err);
out:
	free(req);
	ik_buf_free(&key);
	cJSON_Delete(env);
	ik_lines_free(&in);
	return rc;
}
