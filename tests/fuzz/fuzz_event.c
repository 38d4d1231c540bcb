/* libFuzzer target: ChargeDueEvent parsing.  Beyond "no crash", it checks
 * the promises an accepted event makes (money is a positive integer in
 * range, ids use the alphabet, the fingerprint is 64 hex digits). */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/event.h"
#include "core/outcome.h"

static void
check_id(const char *s, size_t max)
{
	size_t n = strlen(s);
	if (n == 0 || n > max)
		abort();
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && !strchr("._:-", s[i]))
			abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ik_event ev;
	ik_err err = { 0 };
	char id[IK_CHARGE_ID_MAX + 1];
	char *body = malloc(size + 1);

	if (!body)
		return 0;
	memcpy(body, data, size);
	body[size] = '\0';
	if (ik_event_parse(body, size, &ev, &err) == IK_OK) {
		for (size_t i = 0; i < size; i++)   /* JSON has no raw control bytes */
			if (body[i] < 0x20 && body[i] >= 0 && !strchr("\t\n\r", body[i]))
				abort();
		check_id(ev.charge_id, IK_CHARGE_ID_MAX);
		check_id(ev.account_id, IK_ACCOUNT_ID_MAX);
		if (ev.amount < 1 || ev.amount > IK_AMOUNT_MAX || strlen(ev.currency) != 3 ||
		    strlen(ev.fingerprint) != 64)
			abort();
	} else if (err.code != IK_DATAERR || !err.msg[0]) {
		abort();
	}
	ik_event_peek_id(body, id);
	free(body);
	return 0;
}
