/* jqprog.h: a jq program compiled once (libjq), run on one JSON value at
 * a time with named variables: how a bank's request body, reference and
 * decline reason are mapped by configuration instead of code.
 *
 * The program is compiled once per process.  Variables change per call
 * (the idempotency key, the amount), and libjq 1.6 binds --arg values as
 * constants at compile time, so the user's program is wrapped as
 *   .v.NAME as $NAME | ... | .e | (PROGRAM)
 * and run on {"e": input, "v": {NAME: value, ...}}.
 * Module directives (import/include) are therefore not available.
 */
#ifndef IK_JQPROG_H
#define IK_JQPROG_H

#include <stddef.h>

#include "core/err.h"

struct ik_jq;

/* Compiles program with the variables named in vars (NULL-terminated,
 * without '$').  IK_OK, IK_CONFIG with jq's message (what names the
 * program: e.g. "--request"), or IK_SOFTWARE. */
int ik_jq_compile(const char *what, const char *program, const char *const *vars,
                  struct ik_jq **out, ik_err *err);

/* Runs the program on input, JSON text of len bytes (NULL: null), with
 * vars_json (JSON text of an object NAME -> value, or NULL).  *out gets the
 * first output as compact JSON text (malloc'd), or NULL when the program
 * yields nothing.  IK_OK, IK_CONFIG with jq's runtime error (or when input
 * is not JSON), or IK_SOFTWARE.  Text in and out: the callers hold JSON
 * text already (the message body, the bank's answer) and send text. */
int ik_jq_run(struct ik_jq *q, const char *input, size_t len, const char *vars_json,
              char **out, ik_err *err);

void ik_jq_free(struct ik_jq *q);

#endif
