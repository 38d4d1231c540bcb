/* redis_dl.h: hiredis, loaded the first time it is needed (dl.h says why).
 *
 * lib/conn/redis.h includes this header instead of <hiredis/hiredis.h>, so
 * redis.c, store_redis.c and store_cache.c (hiredis's only callers) reach
 * it through the table below.  ik_redis_ensure (first connect: the store
 * connects when opened) and the cache's open call ik_hiredis_load() before
 * any hiredis function.
 */
#ifndef IK_REDIS_DL_H
#define IK_REDIS_DL_H

#include <hiredis/hiredis.h>

#include "dl/dl.h"

#ifndef IK_LIBHIREDIS
#define IK_LIBHIREDIS "libhiredis.so.0.14"
#endif
#ifndef IK_LIBHIREDIS_DEB
#define IK_LIBHIREDIS_DEB "libhiredis0.14"
#endif

#define IK_HIREDIS_FUNCS(X) \
	X(redisConnectWithTimeout) X(redisSetTimeout) X(redisFree) \
	X(redisAppendCommandArgv) X(redisGetReply) X(freeReplyObject)

struct ik_hiredis_api {
	IK_HIREDIS_FUNCS(IK_DL_FIELD)
};
extern struct ik_hiredis_api ik_hiredis;

/* IK_OK, or IK_CONFIG when hiredis or one of its functions is missing. */
int ik_hiredis_load(ik_err *err);

#ifndef IK_REDIS_DL_IMPL  /* redis_dl.c names the symbols themselves */
#define redisConnectWithTimeout (ik_hiredis.redisConnectWithTimeout)
#define redisSetTimeout         (ik_hiredis.redisSetTimeout)
#define redisFree               (ik_hiredis.redisFree)
#define redisAppendCommandArgv  (ik_hiredis.redisAppendCommandArgv)
#define redisGetReply           (ik_hiredis.redisGetReply)
#define freeReplyObject         (ik_hiredis.freeReplyObject)
#endif

#endif
