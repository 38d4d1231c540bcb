/* utf8.h: text from outside (a bank's reason, a gateway's error body) made
 * valid UTF-8 before it is cut or stored.
 *
 * PostgreSQL refuses a text parameter that is not valid UTF-8 (SQLSTATE
 * 22021) and DynamoDB a request body that is not (SerializationException),
 * so a reason cut inside a multi-byte character, or copied raw from a body
 * in another encoding, would turn a finish into an error after the money
 * moved.  Valid means RFC 3629: no overlong forms, no surrogates, nothing
 * above U+10FFFF.  Each byte that does not start a valid sequence becomes
 * U+FFFD; a cut never splits a character.
 */
#ifndef IK_UTF8_H
#define IK_UTF8_H

#include <stddef.h>

/* The length of the valid sequence at s (n bytes available): 1-4, or 0
 * when s[0] does not start one. */
size_t ik_utf8_seq(const unsigned char *s, size_t n);

/* Whether the n bytes at s are valid UTF-8. */
int ik_utf8_valid(const char *s, size_t n);

/* Copies at most n bytes of s into out (outsz bytes with the NUL, > 0),
 * replacing each invalid byte with U+FFFD and stopping before the first
 * character that would not fit whole.  Returns the bytes written (not
 * counting the NUL); out is always valid UTF-8 and NUL-terminated. */
size_t ik_utf8_copy(char *out, size_t outsz, const char *s, size_t n);

/* s (NUL-terminated, may be NULL) as valid UTF-8: s itself when it is
 * valid already (*copy NULL), else a malloc'd copy with each invalid byte
 * replaced, also put in *copy for the caller to free.  -1 when out of
 * memory, else 0. */
int ik_utf8_clean(const char *s, const char **out, char **copy);

#endif
