/* curl_dl.h: libcurl, loaded the first time it is needed.
 *
 * Merely linking libcurl costs a process about 5 ms of CPU before main
 * (the dynamic loader maps and relocates ~35 libraries: TLS, Kerberos,
 * LDAP, ...), and most commands never make an HTTP call with the embedded
 * backends.  So nothing links it: lib/http.c and lib/aws.c include this
 * header instead of <curl/curl.h>, their curl_* calls go through the
 * function table below, and ik_curl_load() dlopen()s the library on first
 * use.  Call it before any curl_* function; it is cheap once loaded.
 */
#ifndef IK_CURL_DL_H
#define IK_CURL_DL_H

/* The typecheck macros wrap curl_easy_setopt by name; the calls go
 * through our table instead, so they cannot apply. */
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include "err.h"

#ifndef IK_LIBCURL
#define IK_LIBCURL "libcurl.so.4"
#endif

struct ik_curl_api {
	__typeof__(curl_global_init) *global_init;
	__typeof__(curl_easy_init) *easy_init;
	__typeof__(curl_easy_setopt) *easy_setopt;
	__typeof__(curl_easy_perform) *easy_perform;
	__typeof__(curl_easy_getinfo) *easy_getinfo;
	__typeof__(curl_easy_reset) *easy_reset;
	__typeof__(curl_easy_cleanup) *easy_cleanup;
	__typeof__(curl_easy_strerror) *easy_strerror;
	__typeof__(curl_slist_append) *slist_append;
	__typeof__(curl_slist_free_all) *slist_free_all;
	__typeof__(curl_free) *free;
	__typeof__(curl_url) *url;
	__typeof__(curl_url_cleanup) *url_cleanup;
	__typeof__(curl_url_set) *url_set;
	__typeof__(curl_url_get) *url_get;
	__typeof__(curl_url_strerror) *url_strerror;
	__typeof__(curl_multi_init) *multi_init;
	__typeof__(curl_multi_cleanup) *multi_cleanup;
	__typeof__(curl_multi_setopt) *multi_setopt;
	__typeof__(curl_multi_add_handle) *multi_add_handle;
	__typeof__(curl_multi_remove_handle) *multi_remove_handle;
	__typeof__(curl_multi_perform) *multi_perform;
	__typeof__(curl_multi_poll) *multi_poll;
	__typeof__(curl_multi_info_read) *multi_info_read;
	__typeof__(curl_multi_strerror) *multi_strerror;
};
extern struct ik_curl_api ik_curl;

/* IK_OK, or IK_CONFIG when the library or one of its functions is
 * missing (err says which). */
int ik_curl_load(ik_err *err);

#ifndef IK_CURL_DL_IMPL
#undef curl_easy_setopt    /* curl.h's three-argument check macros */
#undef curl_easy_getinfo
#define curl_global_init   (ik_curl.global_init)
#define curl_easy_init     (ik_curl.easy_init)
#define curl_easy_setopt   (ik_curl.easy_setopt)
#define curl_easy_perform  (ik_curl.easy_perform)
#define curl_easy_getinfo  (ik_curl.easy_getinfo)
#define curl_easy_reset    (ik_curl.easy_reset)
#define curl_easy_cleanup  (ik_curl.easy_cleanup)
#define curl_easy_strerror (ik_curl.easy_strerror)
#define curl_slist_append  (ik_curl.slist_append)
#define curl_slist_free_all (ik_curl.slist_free_all)
#define curl_free          (ik_curl.free)
#define curl_url           (ik_curl.url)
#define curl_url_cleanup   (ik_curl.url_cleanup)
#define curl_url_set       (ik_curl.url_set)
#define curl_url_get       (ik_curl.url_get)
#define curl_url_strerror  (ik_curl.url_strerror)
#undef curl_multi_setopt
#define curl_multi_init    (ik_curl.multi_init)
#define curl_multi_cleanup (ik_curl.multi_cleanup)
#define curl_multi_setopt  (ik_curl.multi_setopt)
#define curl_multi_add_handle (ik_curl.multi_add_handle)
#define curl_multi_remove_handle (ik_curl.multi_remove_handle)
#define curl_multi_perform (ik_curl.multi_perform)
#define curl_multi_poll    (ik_curl.multi_poll)
#define curl_multi_info_read (ik_curl.multi_info_read)
#define curl_multi_strerror (ik_curl.multi_strerror)
#endif

#endif
