/* curl_dl.c: dlopen libcurl on first use; see curl_dl.h. */
#define IK_CURL_DL_IMPL
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "curl_dl.h"
#include "outcome.h"

struct ik_curl_api ik_curl;

static const struct {
	const char *name;
	size_t off;
} syms[] = {
#define S(n, f) { #n, offsetof(struct ik_curl_api, f) }
	S(curl_global_init, global_init), S(curl_easy_init, easy_init),
	S(curl_easy_setopt, easy_setopt), S(curl_easy_perform, easy_perform),
	S(curl_easy_getinfo, easy_getinfo), S(curl_easy_reset, easy_reset),
	S(curl_easy_cleanup, easy_cleanup), S(curl_easy_strerror, easy_strerror),
	S(curl_slist_append, slist_append), S(curl_slist_free_all, slist_free_all),
	S(curl_free, free), S(curl_url, url), S(curl_url_cleanup, url_cleanup),
	S(curl_url_set, url_set), S(curl_url_get, url_get),
	S(curl_url_strerror, url_strerror),
	S(curl_multi_init, multi_init), S(curl_multi_cleanup, multi_cleanup),
	S(curl_multi_setopt, multi_setopt), S(curl_multi_add_handle, multi_add_handle),
	S(curl_multi_remove_handle, multi_remove_handle),
	S(curl_multi_perform, multi_perform), S(curl_multi_poll, multi_poll),
	S(curl_multi_info_read, multi_info_read), S(curl_multi_strerror, multi_strerror),
#undef S
};

int
ik_curl_load(ik_err *err)
{
	static void *lib;
	struct ik_curl_api api;

	if (lib)
		return IK_OK;
	/* idemkit commands are single-threaded: no lock needed. */
	void *h = dlopen(IK_LIBCURL, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return ik_errf(err, IK_CONFIG, "cannot load libcurl: %s", dlerror());
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		void *f = dlsym(h, syms[i].name);
		if (!f) {
			dlclose(h);
			return ik_errf(err, IK_CONFIG, "%s has no %s (libcurl too old?)",
			    IK_LIBCURL, syms[i].name);
		}
		/* POSIX guarantees a dlsym result converts to a function pointer. */
		memcpy((char *)&api + syms[i].off, &f, sizeof f);
	}
	ik_curl = api;
	lib = h;
	return IK_OK;
}
