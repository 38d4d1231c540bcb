/* store_cache.h: the Redis fast path (IDEMKIT_CACHE=redis://...) in front of
 * any store, for the factory (open_store.c); commands never know it is
 * there (store.h). */
#ifndef IK_STORE_CACHE_H
#define IK_STORE_CACHE_H

#include "core/err.h"

struct ik_store;

/* The Redis fast path (IDEMKIT_CACHE=cache_url) in front of the store that
 * open(rest) opens, filling s.  A store that is unreachable (IK_TEMPFAIL)
 * is opened again on use, so the cache can answer meanwhile. */
int ik_store_cache_open(const char *cache_url,
    int (*open)(const char *rest, struct ik_store *s, ik_err *err), const char *rest,
    struct ik_store *s, ik_err *err);

#endif
