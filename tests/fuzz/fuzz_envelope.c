/* libFuzzer target: envelope parsing, the verdict, and printing back.  An
 * envelope always comes out (a poison line travels as the body), and what
 * is printed parses again to the same verdict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/envelope.h"
#include "core/outcome.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *env = NULL, *again = NULL;
	ik_err err = { 0 };
	const char *why;
	char *line;
	int rc, v;

	rc = ik_env_parse((const char *)data, size, &env, &err);
	if (!env)
		return 0;   /* out of memory only */
	if (rc != IK_OK && rc != IK_DATAERR)
		abort();
	v = ik_env_verdict(env, &why);
	if (!ik_outcome_by_code(v) || !why)
		abort();
	(void)ik_env_outcome(env);
	(void)ik_env_body(env);
	if ((line = ik_env_print(env))) {
		if (ik_env_parse(line, strlen(line), &again, &err) != IK_OK)
			abort();
		if (ik_env_verdict(again, &why) != v)
			abort();
		cJSON_Delete(again);
		free(line);
	}
	cJSON_Delete(env);
	return 0;
}
