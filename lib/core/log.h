/* log.h: structured logs and audit lines on stderr, one JSON object per line.
 *
 * Every line carries ts, level, prog, and the fields given.  Never pass a
 * secret; never log to stdout (it carries envelopes).  IDEMKIT_LOG=quiet
 * drops info lines, debug adds debug lines.
 */
#ifndef IK_LOG_H
#define IK_LOG_H

#include <stdint.h>

enum ik_level { IK_LOG_DEBUG, IK_LOG_INFO, IK_LOG_WARN, IK_LOG_ERROR, IK_LOG_AUDIT };

void ik_log_init(const char *prog);
const char *ik_prog(void);

/* Fields as key/value string pairs ending with NULL; a NULL value is
 * skipped.  A number is IK_LOG_NUM(key, value), written as a JSON number
 * (a NULL key skips it):
 *   ik_log(IK_LOG_INFO, "claimed", "chargeId", id, IK_LOG_NUM("attempt", 2), NULL);
 */
void ik_log(enum ik_level lvl, const char *msg, ...) __attribute__((sentinel));

/* Whether a line of level lvl would be written (IDEMKIT_LOG). */
int ik_log_enabled(enum ik_level lvl);

/* The marker IK_LOG_NUM puts in the key's place: the real key and an
 * int64_t follow it. */
extern const char ik_log_num_field[];
#define IK_LOG_NUM(key, value) ik_log_num_field, (const char *)(key), (int64_t)(value)

#endif
