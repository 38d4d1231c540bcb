/* dl.c: dlopen a library on first use and fill its table; see dl.h. */
#include <dlfcn.h>
#include <string.h>

#include "core/outcome.h"
#include "dl/dl.h"

int
ik_dl_load(struct ik_dl *l, ik_err *err)
{
	void *h;

	if (l->handle)
		return IK_OK;
	if (!(h = dlopen(l->soname, RTLD_LAZY | RTLD_LOCAL)))
		return ik_errf(err, IK_CONFIG, "cannot load %s: %s (install the Debian "
		    "package %s)", l->what, dlerror(), l->deb);
	for (size_t i = 0; i < l->nsyms; i++) {
		void *f = dlsym(h, l->syms[i].name);
		if (!f) {
			memset(l->table, 0, l->size);
			dlclose(h);
			return ik_errf(err, IK_CONFIG, "%s has no %s (%s too old? install the "
			    "Debian package %s)", l->soname, l->syms[i].name, l->what, l->deb);
		}
		/* POSIX guarantees a dlsym result converts to a function pointer. */
		memcpy((char *)l->table + l->syms[i].off, &f, sizeof f);
	}
	l->handle = h;
	return IK_OK;
}
