/* pq_dl.c: libpq's symbols, loaded by ik_dl_load on first use; see pq_dl.h. */
#define IK_PQ_DL_IMPL
#include <stddef.h>

#include "dl/pq_dl.h"

struct ik_pq_api ik_pq;

#define S(f) IK_DL_SYM(struct ik_pq_api, f)
static const struct ik_dl_sym syms[] = { IK_PQ_FUNCS(S) };
#undef S

int
ik_pq_load(ik_err *err)
{
	static struct ik_dl lib = { "libpq", IK_LIBPQ, IK_LIBPQ_DEB, syms,
	    sizeof syms / sizeof syms[0], &ik_pq, sizeof ik_pq, NULL };

	return ik_dl_load(&lib, err);
}
