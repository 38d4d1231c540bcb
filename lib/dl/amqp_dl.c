/* amqp_dl.c: librabbitmq's symbols, loaded by ik_dl_load on first use; see
 * amqp_dl.h. */
#define IK_AMQP_DL_IMPL
#include <stddef.h>

#include "dl/amqp_dl.h"

struct ik_amqp_api ik_amqpl;

#define S(f) IK_DL_SYM(struct ik_amqp_api, f)
static const struct ik_dl_sym syms[] = { IK_AMQP_FUNCS(S) };
#undef S

int
ik_amqp_load(ik_err *err)
{
	static struct ik_dl lib = { "librabbitmq", IK_LIBRABBITMQ, IK_LIBRABBITMQ_DEB, syms,
	    sizeof syms / sizeof syms[0], &ik_amqpl, sizeof ik_amqpl, NULL };

	return ik_dl_load(&lib, err);
}
