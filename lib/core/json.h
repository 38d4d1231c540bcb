/* json.h: cJSON trees printed without cJSON's number round trip.
 *
 * cJSON_PrintUnformatted prints every number above INT_MAX (epoch ms,
 * leases) with "%1.15g" and reads it back with sscanf to check it; the
 * envelope of every charge carries several.  ik_json_print writes the same
 * bytes as cJSON_PrintUnformatted (tests/unit/json_print.c compares them)
 * but prints an integral number below 10^15 as its digits directly; any
 * other number goes through cJSON's own printer, so nothing changes.
 */
#ifndef IK_JSON_H
#define IK_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* A growable text buffer; start with {0}, free p when done. */
struct ik_jbuf {
	char *p;
	size_t len, cap;
	int oom;            /* an append failed: the text is incomplete */
};

void ik_jbuf_put(struct ik_jbuf *b, const char *s, size_t n);
/* s as a JSON string (quotes included), escaped as cJSON does. */
void ik_jbuf_str(struct ik_jbuf *b, const char *s);
/* d as cJSON prints a number. */
void ik_jbuf_num(struct ik_jbuf *b, double d);
/* The item, unformatted, as cJSON_PrintUnformatted would; -1 when it
 * cannot be printed (an invalid item, a raw item without text). */
int ik_jbuf_json(struct ik_jbuf *b, const cJSON *item);

/* cJSON_PrintUnformatted's text, malloc'd (free it); NULL on ENOMEM or
 * where cJSON would fail. */
char *ik_json_print(const cJSON *item);

#endif
