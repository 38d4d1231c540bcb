/* curl_dl.c: libcurl's symbols, loaded by ik_dl_load on first use; see curl_dl.h. */
#define IK_CURL_DL_IMPL
#include <stddef.h>

#include "dl/curl_dl.h"

struct ik_curl_api ik_curl;

#define S(f) IK_DL_SYM(struct ik_curl_api, f)
static const struct ik_dl_sym syms[] = { IK_CURL_FUNCS(S) };
#undef S

int
ik_curl_load(ik_err *err)
{
	static struct ik_dl lib = { "libcurl", IK_LIBCURL, "libcurl4", syms,
	    sizeof syms / sizeof syms[0], &ik_curl, sizeof ik_curl, NULL };

	return ik_dl_load(&lib, err);
}
