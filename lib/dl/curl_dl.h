/* curl_dl.h: libcurl, loaded the first time it is needed (dl.h says why).
 *
 * lib/conn/http.c and lib/aws/ include this header instead of <curl/curl.h>;
 * their curl_* calls go through the function table below, and
 * ik_curl_load() dlopen()s the library on first use.  Call it before any
 * curl_* function; it is cheap once loaded.
 */
#ifndef IK_CURL_DL_H
#define IK_CURL_DL_H

/* The typecheck macros wrap curl_easy_setopt by name; the calls go
 * through our table instead, so they cannot apply. */
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include "dl/dl.h"

#ifndef IK_LIBCURL
#define IK_LIBCURL "libcurl.so.4"
#endif

#define IK_CURL_FUNCS(X) \
	X(curl_global_init) X(curl_easy_init) X(curl_easy_setopt) \
	X(curl_easy_perform) X(curl_easy_getinfo) X(curl_easy_reset) \
	X(curl_easy_cleanup) X(curl_easy_strerror) X(curl_slist_append) \
	X(curl_slist_free_all) X(curl_free) X(curl_url) \
	X(curl_url_cleanup) X(curl_url_set) X(curl_url_get) \
	X(curl_url_strerror) X(curl_multi_init) X(curl_multi_cleanup) \
	X(curl_multi_setopt) X(curl_multi_add_handle) X(curl_multi_remove_handle) \
	X(curl_multi_socket_action) X(curl_multi_info_read) \
	X(curl_multi_strerror) X(curl_version_info)

struct ik_curl_api {
	IK_CURL_FUNCS(IK_DL_FIELD)
};
extern struct ik_curl_api ik_curl;

/* IK_OK, or IK_CONFIG when libcurl or one of its functions is missing. */
int ik_curl_load(ik_err *err);

#ifndef IK_CURL_DL_IMPL  /* curl_dl.c names the symbols themselves */
#undef curl_easy_setopt    /* curl.h's three-argument check macros */
#undef curl_easy_getinfo
#undef curl_multi_setopt
#define curl_global_init         (ik_curl.curl_global_init)
#define curl_easy_init           (ik_curl.curl_easy_init)
#define curl_easy_setopt         (ik_curl.curl_easy_setopt)
#define curl_easy_perform        (ik_curl.curl_easy_perform)
#define curl_easy_getinfo        (ik_curl.curl_easy_getinfo)
#define curl_easy_reset          (ik_curl.curl_easy_reset)
#define curl_easy_cleanup        (ik_curl.curl_easy_cleanup)
#define curl_easy_strerror       (ik_curl.curl_easy_strerror)
#define curl_slist_append        (ik_curl.curl_slist_append)
#define curl_slist_free_all      (ik_curl.curl_slist_free_all)
#define curl_free                (ik_curl.curl_free)
#define curl_url                 (ik_curl.curl_url)
#define curl_url_cleanup         (ik_curl.curl_url_cleanup)
#define curl_url_set             (ik_curl.curl_url_set)
#define curl_url_get             (ik_curl.curl_url_get)
#define curl_url_strerror        (ik_curl.curl_url_strerror)
#define curl_multi_init          (ik_curl.curl_multi_init)
#define curl_multi_cleanup       (ik_curl.curl_multi_cleanup)
#define curl_multi_setopt        (ik_curl.curl_multi_setopt)
#define curl_multi_add_handle    (ik_curl.curl_multi_add_handle)
#define curl_multi_remove_handle (ik_curl.curl_multi_remove_handle)
#define curl_multi_socket_action (ik_curl.curl_multi_socket_action)
#define curl_multi_info_read     (ik_curl.curl_multi_info_read)
#define curl_multi_strerror      (ik_curl.curl_multi_strerror)
#define curl_version_info        (ik_curl.curl_version_info)
#endif

#endif
