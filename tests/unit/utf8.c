/* utf8: lib/core/utf8.c on the byte strings given as hex arguments: one line
 * each, "HEX valid|invalid CLEANHEX CUT5HEX" (the string repaired, and
 * copied into 6 bytes: at most 5 and a NUL).  tests/postgres.bats holds
 * the answers against PostgreSQL's own UTF-8 check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

static void
hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		printf("%02x", (unsigned char)s[i]);
	if (!n)
		printf("-");
}

int
main(int argc, char **argv)
{
	for (int a = 1; a < argc; a++) {
		size_t n = strlen(argv[a]) / 2;
		char *s = calloc(1, n + 1), cut[6];
		const char *clean;
		char *copy;

		if (!s)
			return 1;
		for (size_t i = 0; i < n; i++)
			s[i] = (char)strtol((char[3]){ argv[a][2 * i], argv[a][2 * i + 1], 0 }, NULL, 16);
		if (strlen(s) != n || ik_utf8_clean(s, &clean, &copy) < 0)
			return 1;
		printf("%s %s ", argv[a], ik_utf8_valid(s, n) ? "valid" : "invalid");
		hex(clean, strlen(clean));
		printf(" ");
		hex(cut, ik_utf8_copy(cut, sizeof cut, s, n));
		printf("\n");
		free(copy);
		free(s);
	}
	return 0;
}
