/* log.h: structured logs and audit lines on stderr, one JSON object per line.
 *
 * Every line carries ts, level, prog, and the fields given.  Never pass a
 * secret; never log to stdout (it carries envelopes).  IDEMKIT_LOG=quiet
 * drops info lines, debug adds debug lines.
 */
#ifndef IK_LOG_H
#define IK_LOG_H

enum ik_level { IK_LOG_DEBUG, IK_LOG_INFO, IK_LOG_WARN, IK_LOG_ERROR, IK_LOG_AUDIT };

void ik_log_init(const char *prog);
const char *ik_prog(void);

/* Fields as key/value string pairs ending with NULL; a NULL value is
 * skipped.  Values that look like integers are written as numbers when
 * the key ends in a '#': ik_log(IK_LOG_INFO, "claimed", "chargeId", id,
 * "attempt#", "2", NULL). */
void ik_log(enum ik_level lvl, const char *msg, ...) __attribute__((sentinel));

#endif
