/* redis_dl.c: hiredis's symbols, loaded by ik_dl_load on first use; see
 * redis_dl.h. */
#define IK_REDIS_DL_IMPL
#include <stddef.h>

#include "dl/redis_dl.h"

struct ik_hiredis_api ik_hiredis;

#define S(f) IK_DL_SYM(struct ik_hiredis_api, f)
static const struct ik_dl_sym syms[] = { IK_HIREDIS_FUNCS(S) };
#undef S

int
ik_hiredis_load(ik_err *err)
{
	static struct ik_dl lib = { "hiredis", IK_LIBHIREDIS, IK_LIBHIREDIS_DEB, syms,
	    sizeof syms / sizeof syms[0], &ik_hiredis, sizeof ik_hiredis, NULL };

	return ik_dl_load(&lib, err);
}
