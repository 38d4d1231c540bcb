/* jqprog.c: jq programs through libjq; see jqprog.h.
 *
 * Values cross as JSON text: the callers hold text (the message body, the
 * bank's answer) and send text, so no tree is built twice.  Amounts stay
 * exact: they are integers below 2^53.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jq.h>

#include "bank/jqprog.h"
#include "core/outcome.h"
#include "core/util.h"

struct ik_jq {
	jq_state *jq;
	char what[32];
	char msg[200];      /* the last error jq reported */
};

/* libjq reports each compile error, then a summary ("jq: 1 compile
 * error"): the first is the one that says what is wrong, and only its
 * first line (the rest quotes our wrapped program back). */
static void
on_error(void *arg, jv msg)
{
	struct ik_jq *q = arg;
	jv s = jv_get_kind(msg) == JV_KIND_STRING ? jv_copy(msg) : jv_dump_string(jv_copy(msg), 0);
	const char *t;
	size_t n;

	if (!q->msg[0] && jv_get_kind(s) == JV_KIND_STRING) {
		t = jv_string_value(s);
		if (strncmp(t, "jq: error: ", 11) == 0)
			t += 11;
		n = strcspn(t, "\n");
		while (n && (t[n - 1] == ':' || t[n - 1] == ' '))
			n--;
		snprintf(q->msg, sizeof q->msg, "%.*s", (int)n, t);
	}
	jv_free(s);
	jv_free(msg);
}

/* Whether program names $var (a longer name sharing the prefix, or one
 * inside a string, only costs an unused binding). */
static int
mentions(const char *program, const char *var)
{
	const char *p = program;
	size_t n = strlen(var);

	while ((p = strchr(p, '$'))) {
		p++;
		if (strncmp(p, var, n) == 0)
			return 1;
	}
	return 0;
}

int
ik_jq_compile(const char *what, const char *program, const char *const *vars,
              struct ik_jq **out, ik_err *err)
{
	struct ik_buf w = {0};
	struct ik_jq *q;
	size_t i;
	int ok;

	*out = NULL;
	if (!(q = calloc(1, sizeof *q)))
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	snprintf(q->what, sizeof q->what, "%s", what);
	if (!(q->jq = jq_init())) {
		free(q);
		return ik_errf(err, IK_SOFTWARE, "%s: jq_init failed", what);
	}
	jq_set_error_cb(q->jq, on_error, q);
	/* Only the variables the program names: each binding costs a lookup
	 * on every run. */
	for (i = 0; vars && vars[i]; i++)
		if (mentions(program, vars[i]) &&
		    (ik_buf_addstr(&w, ".v.") < 0 || ik_buf_addstr(&w, vars[i]) < 0 ||
		    ik_buf_addstr(&w, " as $") < 0 || ik_buf_addstr(&w, vars[i]) < 0 ||
		    ik_buf_addstr(&w, " | ") < 0))
			goto nomem;
	/* The newline ends a trailing comment in the user's program. */
	if (ik_buf_addstr(&w, ".e | (") < 0 || ik_buf_addstr(&w, program) < 0 ||
	    ik_buf_addstr(&w, "\n)") < 0)
		goto nomem;
	ok = jq_compile_args(q->jq, w.p, jv_object());
	ik_buf_free(&w);
	if (!ok) {
		ik_errf(err, IK_CONFIG, "%s: not a jq program: %s", what,
		        q->msg[0] ? q->msg : "compile error");
		ik_jq_free(q);
		return IK_CONFIG;
	}
	*out = q;
	return IK_OK;
nomem:
	ik_buf_free(&w);
	ik_jq_free(q);
	return ik_errf(err, IK_SOFTWARE, "out of memory");
}

int
ik_jq_run(struct ik_jq *q, const char *input, size_t len, const char *vars_json,
          char **out, ik_err *err)
{
	struct ik_buf w = {0};
	jv in, r, s, m;
	int rc = IK_OK;

	*out = NULL;
	if (ik_buf_addstr(&w, "{\"e\":") < 0 ||
	    (input ? ik_buf_add(&w, input, len) : ik_buf_addstr(&w, "null")) < 0 ||
	    ik_buf_addstr(&w, ",\"v\":") < 0 ||
	    ik_buf_addstr(&w, vars_json ? vars_json : "null") < 0 ||
	    ik_buf_addstr(&w, "}") < 0) {
		ik_buf_free(&w);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	in = jv_parse_sized(w.p, (int)w.len);
	ik_buf_free(&w);
	if (!jv_is_valid(in)) {
		jv_free(in);
		return ik_errf(err, IK_CONFIG, "%s: the input is not JSON", q->what);
	}
	q->msg[0] = '\0';
	jq_start(q->jq, in, 0);
	r = jq_next(q->jq);
	if (jv_is_valid(r)) {
		s = jv_dump_string(r, 0);
		if (!(*out = strdup(jv_string_value(s))))
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
		jv_free(s);
	} else if (jv_invalid_has_msg(jv_copy(r))) {
		m = jv_invalid_get_msg(r);
		s = jv_get_kind(m) == JV_KIND_STRING ? m : jv_dump_string(m, 0);
		rc = ik_errf(err, IK_CONFIG, "%s: jq error: %.150s", q->what, jv_string_value(s));
		jv_free(s);
	} else {
		jv_free(r);           /* no output: *out stays NULL */
	}
	return rc;
}

void
ik_jq_free(struct ik_jq *q)
{
	if (!q)
		return;
	jq_teardown(&q->jq);
	free(q);
}
