/* bankapi_int.h: what the files of the bank API (bankapi.c, the endpoint
 * and its requests; bankapi_oauth.c, the OAuth2 token; bankapi_conf.c, the
 * variables and status classes both read) share, and nothing outside them
 * uses. */
#ifndef IK_BANKAPI_INT_H
#define IK_BANKAPI_INT_H

#include <stddef.h>

#include "bank/bankapi.h"

#define IK_BANKAPI_SECRET_MAX 8192
#define IK_BANKAPI_BEARER "Authorization: Bearer "
#define IK_BANKAPI_BEARER_LEN (sizeof IK_BANKAPI_BEARER - 1)

/* $IDEMKIT_<prefix>_<name> when set and not empty, else NULL; buf gets
 * the variable's name, for messages. */
const char *ik_bankapi_env(const char *prefix, const char *name, char *buf, size_t n);

/* A token is one line of printable ASCII, no space, not empty. */
int ik_bankapi_token_ok(const char *s, size_t n);

/* The OAuth2 settings from IDEMKIT_<P>_OAUTH_*, the secret read (no
 * network call): IK_OK (none set is fine), IK_CONFIG or IK_SOFTWARE. */
int ik_bankapi_oauth_open(struct ik_bankapi *a, ik_err *err);

/* A token into a->auth when there is none or it is due for refresh:
 * IK_OK, or the fetch's failure (kept and answered at once, without a
 * request, until a->oauth_retry_at). */
int ik_bankapi_oauth_token(struct ik_bankapi *a, ik_err *err);

#endif
