/* redis.h: what the Redis store (store_redis.c) and the Redis cache
 * (store_cache.c) share: the URL, one connection with timeouts, and Lua
 * scripts run by SHA.  hiredis is called only from redis.c and those two
 * (and store_redis_outbox.c, the store's outbox half), through redis_dl.h
 * (loaded on first use).
 *
 * Rules: the password is a secret: it is never part of a message or a log
 * line (messages name "redis HOST:PORT/DB"), and it is wiped on free.
 * Every error is classified once here: an unreachable or busy server is
 * IK_TEMPFAIL, a refused login IK_CONFIG, anything else IK_SOFTWARE.
 * After a connection error the connection is dropped and the next call
 * connects again; no write is ever retried blindly (its answer may have
 * been lost after it was applied): the store's finish, fenced by its
 * token, is sent again and decided from the record (store_redis.c), and
 * `unsure` below says when that is needed.  A kept connection the server
 * closed meanwhile is found (ik_fd_ready) and made afresh before sending.
 */
#ifndef IK_REDIS_H
#define IK_REDIS_H

#include <stdint.h>

#include "core/err.h"
#include "dl/redis_dl.h"

struct ik_redis_url {
	char *host;
	int port;
	int db;
	char *user, *pass;      /* NULL when absent; pass is wiped on free */
	int durability_unsafe;  /* ?durability=unsafe */
	int wait;               /* ?wait=N replicas after every write */
	int64_t timeout_ms;     /* ?timeout=DUR: connect and command, 0 = default */
	char label[300];        /* "redis HOST:PORT/DB", for messages */
};

/* rest: what follows "redis://".  IK_OK or IK_CONFIG with err. */
int ik_redis_url_parse(const char *rest, struct ik_redis_url *u, ik_err *err);
void ik_redis_url_free(struct ik_redis_url *u);
/* Non-zero when a redis:// URL carries a password (user:pass@). */
int ik_redis_url_has_password(const char *url);

struct ik_redis_script {
	const char *name;       /* for messages: "claim" */
	const char *src;
	char sha[41];           /* filled by SCRIPT LOAD on first use */
};

struct ik_redis {
	struct ik_redis_url u;
	redisContext *c;
	int64_t timeout_ms;
	/* Called after each (re)connect and login, e.g. the durability check;
	 * may be NULL. */
	int (*on_connect)(struct ik_redis *r, ik_err *err);
	void *arg;
	/* Set when the last command (ik_redis_cmd, ik_redis_eval) failed after
	 * it was sent, the connection lost before its answer: whether the
	 * server ran it cannot be known. */
	int unsure;
	/* The boot clock (util.h ik_boot_ms) just before ik_redis_eval last
	 * sent its script, connected: a claim's lease proof (store.h). */
	int64_t sent_boot_ms;
};

/* Connects (again) when not connected: connect, AUTH, SELECT, on_connect. */
int ik_redis_ensure(struct ik_redis *r, ik_err *err);
void ik_redis_close(struct ik_redis *r);

/* One command (argv form); the reply (caller frees) or NULL with err.  An
 * error reply is turned into err too. */
redisReply *ik_redis_cmd(struct ik_redis *r, const char *what, int argc,
    const char **argv, const size_t *lens, ik_err *err);

/* EVALSHA s with argc arguments (keys first, nkeys of them), loading the
 * script on first use and again after NOSCRIPT.  When r->u.wait > 0 a
 * WAIT for that many replicas is sent in the same round trip; fewer
 * acknowledgements is IK_TEMPFAIL (the write is done on the primary).
 * The script's reply (caller frees) or NULL with err. */
redisReply *ik_redis_eval(struct ik_redis *r, struct ik_redis_script *s, int nkeys,
    int argc, const char **argv, const size_t *lens, int wait, ik_err *err);

/* A string reply as a C string (caller frees); NULL when v is not a
 * string or out of memory. */
char *ik_redis_str(const redisReply *v);

#endif
