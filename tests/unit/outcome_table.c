/* Prints the exit-code table of lib/core/outcome.c, one row a line, in the form
 * man/idemkit.7 uses, so tests/contract.bats can check the page against it. */
#include <stdio.h>

#include "core/outcome.h"

int
main(void)
{
	int n;
	const struct ik_outcome *t = ik_outcomes(&n);

	for (int i = 0; i < n; i++) {
		if (ik_outcome_by_code(t[i].code) != &t[i] || ik_outcome_by_name(t[i].name) != &t[i]) {
			fprintf(stderr, "row %d does not round-trip\n", i);
			return 1;
		}
		printf(".It %d Ta %s Ta %s; %s\n", t[i].code, t[i].name, t[i].meaning,
		    t[i].action_text);
	}
	return 0;
}
