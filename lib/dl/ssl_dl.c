/* ssl_dl.c: libssl's symbols, loaded by ik_dl_load on first use; see ssl_dl.h. */
#define IK_SSL_DL_IMPL
#include <stddef.h>

#include "dl/ssl_dl.h"

struct ik_ssl_api ik_ssl;

#define S(f) IK_DL_SYM(struct ik_ssl_api, f)
static const struct ik_dl_sym syms[] = { IK_SSL_FUNCS(S) };
#undef S

int
ik_ssl_load(ik_err *err)
{
	static struct ik_dl lib = { "libssl", IK_LIBSSL, "libssl3", syms,
	    sizeof syms / sizeof syms[0], &ik_ssl, sizeof ik_ssl, NULL };

	return ik_dl_load(&lib, err);
}
