/* replay: runs a libFuzzer target's LLVMFuzzerTestOneInput over files
 * named on the command line, without libFuzzer, so the seed corpora and
 * the inputs that once crashed (tests/fuzz/regress/) are replayed by
 * `make test` (and under ASan + UBSan by `make sanitize`).  Prints one
 * line per file; a broken promise aborts, as under the fuzzer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		unsigned char *buf = NULL;
		size_t n = 0, cap = 0, got;

		if (!f) {
			perror(argv[i]);
			return 2;
		}
		do {
			if (n == cap) {
				unsigned char *p = realloc(buf, cap = cap ? cap * 2 : 4096);
				if (!p) {
					fclose(f);
					free(buf);
					return 2;
				}
				buf = p;
			}
			got = fread(buf + n, 1, cap - n, f);
			n += got;
		} while (got > 0);
		if (ferror(f)) {
			perror(argv[i]);
			fclose(f);
			free(buf);
			return 2;
		}
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
		free(buf);
		printf("ok %s\n", argv[i]);
	}
	return 0;
}
