/* jqprog.c: jq programs through libjq; see jqprog.h.
 *
 * Values cross between cJSON and jv as JSON text: the programs map small
 * bodies, and one conversion rule is easier to trust than two walkers.
 * Amounts stay exact: they are integers below 2^53.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jq.h>

#include "jqprog.h"
#include "outcome.h"
#include "util.h"

struct ik_jq {
	jq_state *jq;
	char what[32];
	char msg[200];      /* the last error jq reported */
};

static void
on_error(void *arg, jv msg)
{
	struct ik_jq *q = arg;
	jv s = jv_get_kind(msg) == JV_KIND_STRING ? jv_copy(msg) : jv_dump_string(jv_copy(msg), 0);

	if (jv_get_kind(s) == JV_KIND_STRING)
		snprintf(q->msg, sizeof q->msg, "%s", jv_string_value(s));
	jv_free(s);
	jv_free(msg);
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
	for (i = 0; vars && vars[i]; i++)
		if (ik_buf_addstr(&w, ".v.") < 0 || ik_buf_addstr(&w, vars[i]) < 0 ||
		    ik_buf_addstr(&w, " as $") < 0 || ik_buf_addstr(&w, vars[i]) < 0 ||
		    ik_buf_addstr(&w, " | ") < 0)
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
ik_jq_run(struct ik_jq *q, const cJSON *input, const cJSON *vars, cJSON **out,
          ik_err *err)
{
	cJSON *wrap = cJSON_CreateObject(), *nul = cJSON_CreateNull();
	char *text = NULL;
	jv in, r, s, m;
	int rc = IK_OK;

	*out = NULL;
	if (!wrap || !nul ||
	    !cJSON_AddItemReferenceToObject(wrap, "e", (cJSON *)(input ? input : nul)) ||
	    !cJSON_AddItemReferenceToObject(wrap, "v", (cJSON *)(vars ? vars : nul)) ||
	    !(text = cJSON_PrintUnformatted(wrap))) {
		cJSON_Delete(wrap);
		cJSON_Delete(nul);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	cJSON_Delete(wrap);   /* references only: input and vars stay the caller's */
	cJSON_Delete(nul);
	in = jv_parse(text);
	free(text);
	if (!jv_is_valid(in)) {
		jv_free(in);
		return ik_errf(err, IK_SOFTWARE, "%s: input does not convert", q->what);
	}
	q->msg[0] = '\0';
	jq_start(q->jq, in, 0);
	r = jq_next(q->jq);
	if (jv_is_valid(r)) {
		s = jv_dump_string(r, 0);
		if (!(*out = cJSON_Parse(jv_string_value(s))))
			rc = ik_errf(err, IK_SOFTWARE, "%s: output does not convert", q->what);
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
