/* dl.h: a shared library loaded the first time it is needed.
 *
 * Merely linking a library costs every process its dynamic loading before
 * main: libcurl and libpq each pull in some 25 more (TLS, Kerberos, LDAP,
 * SASL), about 5 ms of CPU per process, and with the embedded backends
 * most commands never call them.  So libcurl, libpq and hiredis are not
 * linked: each has a small NAME_dl.h that includes the library's own
 * header, declares a table of the functions we call and #defines their
 * names onto it, and a NAME_dl.c that lists the symbols and calls
 * ik_dl_load on first use of the backend.  One loader for the three, so
 * they load, fail and say why in one way.
 *
 * Rules: RTLD_LOCAL (nothing leaked into the global namespace); every
 * function we call is looked up at load (dlsym), and the table is filled
 * whole or not at all; a missing library or symbol is IK_CONFIG naming the
 * library and the Debian package that ships it.  RTLD_LAZY, not RTLD_NOW:
 * the libraries' own calls into their ~25 dependencies are bound when
 * first made, as when a program links them, instead of all at once; that
 * is about 14% fewer instructions to load libcurl (0.5-1 ms CPU per HTTP
 * step, measured), and the libraries built with BIND_NOW keep it.
 * idemkit commands are single-threaded: no lock.
 */
#ifndef IK_DL_H
#define IK_DL_H

#include <stddef.h>

#include "core/err.h"

struct ik_dl_sym {
	const char *name;
	size_t off;             /* offsetof the pointer in the table */
};

struct ik_dl {
	const char *what;       /* "libpq", for messages */
	const char *soname;     /* "libpq.so.5" */
	const char *deb;        /* the Debian package: "libpq5" */
	const struct ik_dl_sym *syms;
	size_t nsyms;
	void *table;            /* filled on success, left zeroed on failure */
	size_t size;
	void *handle;           /* non-NULL once loaded */
};

/* For a NAME_dl.h: its list of functions is an X-macro, LIST(X) with one
 * X(function) each; IK_DL_FIELD makes the table's members (named as the
 * functions, so `#define PQclear (ik_pq.PQclear)` reaches them) and
 * IK_DL_SYM the symbol list.  A function missing from the list fails to
 * compile; one missing its #define fails to link (nothing links the
 * library). */
#define IK_DL_FIELD(f) __typeof__(f) *f;
#define IK_DL_SYM(type, f) { #f, offsetof(type, f) },

/* IK_OK (at once when already loaded), or IK_CONFIG with err. */
int ik_dl_load(struct ik_dl *l, ik_err *err);

#endif
