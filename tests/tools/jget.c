/*
 * jget PATH < JSON: tests/helper.bash's jget, one value out of a JSON
 * document, in C because the suites call it thousands of times and a
 * python3 start costs five to ten times a process of ours on a loaded
 * machine (issue 43).
 *
 * The contract is Python's, byte for byte, because the assertions were
 * written against it:
 *
 *     v = json.loads(JSON)
 *     for k in PATH.split("."):
 *         v = v[int(k)] if list else v.get(k) if dict else None
 *     print("" if v is None else json.dumps(v) if dict or list else v)
 *
 * so a string prints decoded, true/false as True/False, an object or
 * array as json.dumps writes it (", " and ": ", non-ASCII as \uXXXX).
 * Only the plain cases are done here: whatever this file does not know
 * to print exactly as Python would (a fraction or an exponent, a
 * duplicate key, a negative index, bytes that are not UTF-8, text that is
 * not JSON) is handed to python3 with the program above, so the rare case
 * still answers (or fails) as it always did.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *PY =
	"import json,sys\n"
	"v=json.loads(sys.stdin.read())\n"
	"for k in sys.argv[1].split('.'):\n"
	"    v = v[int(k)] if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None\n"
	"print('' if v is None else (json.dumps(v) if isinstance(v,(dict,list)) else v))\n";

/* The document as read (one trailing newline, a here-string's, dropped),
 * and its length; the path. */
static char *doc;
static size_t doclen;
static const char *path;

/* Python, with the document on its stdin as before (so bytes that are not
 * UTF-8 fail its decoder as they always did). */
static void fallback(void)
{
	int fd[2];
	if (pipe(fd)) { perror("jget: pipe"); exit(70); }
	pid_t pid = fork();
	if (pid < 0) { perror("jget: fork"); exit(70); }
	if (pid == 0) {
		close(fd[0]);
		size_t n = doclen, off = 0;
		while (off < n) {
			ssize_t w = write(fd[1], doc + off, n - off);
			if (w <= 0) _exit(1);
			off += (size_t)w;
		}
		_exit(0);
	}
	close(fd[1]);
	if (dup2(fd[0], 0) < 0) { perror("jget: dup2"); exit(70); }
	close(fd[0]);
	execlp("python3", "python3", "-c", PY, path, (char *)NULL);
	perror("jget: python3");
	exit(70);
}

/* A cursor over the document; any parse trouble means fallback. */
static const char *p;

static void ws(void)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
}

static int hex4(const char *s, unsigned *out)
{
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		char c = s[i];
		v <<= 4;
		if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
		else return -1;
	}
	*out = v;
	return 0;
}

/* One UTF-8 sequence at s (strict, as Python's decoder): its code point
 * and length, or 0 when it is not valid. */
static int utf8(const unsigned char *s, unsigned *cp)
{
	if (s[0] < 0x80) { *cp = s[0]; return 1; }
	int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
	if (!n) return 0;
	unsigned v = s[0] & (0x3f >> (n - 1));
	for (int i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80) return 0;
		v = v << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && (v < 0x800 || (v >= 0xd800 && v < 0xe000))) || (n == 4 && (v < 0x10000 || v > 0x10ffff)))
		return 0;
	*cp = v;
	return n;
}

static void put_utf8(FILE *o, unsigned cp)
{
	if (cp < 0x80) fputc((int)cp, o);
	else if (cp < 0x800) { fputc((int)(0xc0 | cp >> 6), o); fputc((int)(0x80 | (cp & 0x3f)), o); }
	else if (cp < 0x10000) {
		fputc((int)(0xe0 | cp >> 12), o); fputc((int)(0x80 | (cp >> 6 & 0x3f)), o);
		fputc((int)(0x80 | (cp & 0x3f)), o);
	} else {
		fputc((int)(0xf0 | cp >> 18), o); fputc((int)(0x80 | (cp >> 12 & 0x3f)), o);
		fputc((int)(0x80 | (cp >> 6 & 0x3f)), o); fputc((int)(0x80 | (cp & 0x3f)), o);
	}
}

/* json.dumps of one code point inside a string (ensure_ascii). */
static void dump_cp(FILE *o, unsigned cp)
{
	switch (cp) {
	case '"': fputs("\\\"", o); return;
	case '\\': fputs("\\\\", o); return;
	case '\n': fputs("\\n", o); return;
	case '\r': fputs("\\r", o); return;
	case '\t': fputs("\\t", o); return;
	case '\b': fputs("\\b", o); return;
	case '\f': fputs("\\f", o); return;
	}
	if (cp < 0x20 || (cp > 0x7e && cp < 0x10000)) fprintf(o, "\\u%04x", cp);
	else if (cp >= 0x10000) {
		cp -= 0x10000;
		fprintf(o, "\\u%04x\\u%04x", 0xd800 | cp >> 10, 0xdc00 | (cp & 0x3ff));
	} else fputc((int)cp, o);
}

/* A string at p (on its quote); o NULL: only skipped.  raw: printed as
 * print() would (decoded), else as json.dumps would.  -1: fallback. */
static int string(FILE *o, int raw)
{
	p++;
	if (o && !raw) fputc('"', o);
	for (;;) {
		unsigned cp;
		unsigned char c = (unsigned char)*p;
		if (c == '"') { p++; break; }
		if (c < 0x20) return -1;   /* strict: a raw control character, or the end */
		if (c == '\\') {
			char e = p[1];
			p += 2;
			switch (e) {
			case '"': cp = '"'; break;
			case '\\': cp = '\\'; break;
			case '/': cp = '/'; break;
			case 'b': cp = '\b'; break;
			case 'f': cp = '\f'; break;
			case 'n': cp = '\n'; break;
			case 'r': cp = '\r'; break;
			case 't': cp = '\t'; break;
			case 'u':
				if (hex4(p, &cp)) return -1;
				p += 4;
				if (cp >= 0xd800 && cp < 0xdc00 && p[0] == '\\' && p[1] == 'u') {
					unsigned lo;
					if (hex4(p + 2, &lo)) return -1;
					if (lo >= 0xdc00 && lo < 0xe000) {
						cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
						p += 6;
					}
				}
				if (cp >= 0xd800 && cp < 0xe000) return -1;   /* a lone surrogate */
				break;
			default: return -1;
			}
		} else {
			int n = utf8((const unsigned char *)p, &cp);
			if (!n) return -1;
			p += n;
		}
		if (!o) continue;
		if (raw) put_utf8(o, cp);
		else dump_cp(o, cp);
	}
	if (o && !raw) fputc('"', o);
	return 0;
}

/* A number: integers only (their text is what Python prints, but "-0").
 * A fraction or an exponent is a float, whose repr is Python's business. */
static int number(FILE *o)
{
	const char *s = p;
	if (*p == '-') p++;
	if (*p == '0') p++;
	else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
	else return -1;
	if (*p == '.' || *p == 'e' || *p == 'E') return -1;
	if (o) {
		if (p - s == 2 && s[0] == '-' && s[1] == '0') fputc('0', o);
		else fwrite(s, 1, (size_t)(p - s), o);
	}
	return 0;
}

static int value(FILE *o, int top);

/* An object or array: skipped (o NULL) or dumped as json.dumps would.
 * Skipping does not look for duplicate keys: only what is printed or
 * walked needs to be Python's dict. */
static int container(FILE *o)
{
	char close = *p == '{' ? '}' : ']';
	int obj = close == '}';
	const char *keys[64];
	size_t lens[64], nkeys = 0;
	if (o) fputc(*p, o);
	p++;
	ws();
	if (*p == close) { p++; if (o) fputc(close, o); return 0; }
	for (int first = 1;; first = 0) {
		if (!first && o) fputs(", ", o);
		if (obj) {
			if (*p != '"') return -1;
			if (o) {
				/* a key twice, or one with an escape: Python's dict decides */
				const char *k = p + 1, *q = k;
				while (*q && *q != '"' && *q != '\\') q++;
				if (*q != '"' || nkeys == 64) return -1;
				for (size_t i = 0; i < nkeys; i++)
					if (lens[i] == (size_t)(q - k) && !memcmp(keys[i], k, lens[i])) return -1;
				keys[nkeys] = k;
				lens[nkeys++] = (size_t)(q - k);
			}
			if (string(o, 0)) return -1;
			ws();
			if (*p++ != ':') return -1;
			if (o) fputs(": ", o);
			ws();
		}
		if (value(o, 0)) return -1;
		ws();
		if (*p == ',') { p++; ws(); continue; }
		if (*p != close) return -1;
		p++;
		if (o) fputc(close, o);
		return 0;
	}
}

/* A value at p; top: printed as print() would, else as json.dumps. */
static int value(FILE *o, int top)
{
	switch (*p) {
	case '{': case '[':
		return container(o);
	case '"':
		return string(o, top);
	case 't':
		if (strncmp(p, "true", 4)) return -1;
		p += 4;
		if (o) fputs(top ? "True" : "true", o);
		return 0;
	case 'f':
		if (strncmp(p, "false", 5)) return -1;
		p += 5;
		if (o) fputs(top ? "False" : "false", o);
		return 0;
	case 'n':
		if (strncmp(p, "null", 4)) return -1;
		p += 4;
		if (o && !top) fputs("null", o);   /* print(None) is never reached: "" */
		return 0;
	default:
		return number(o);
	}
}

/* Moves p to the member KEY (len n) of the object at p: 1 found, 0 not
 * (p past the object), -1 fallback (bad JSON, or KEY twice: Python keeps
 * the last, in the first one's place). */
static int member(const char *key, size_t n)
{
	const char *found = NULL;
	p++;
	ws();
	if (*p == '}') { p++; return 0; }
	for (;;) {
		if (*p != '"') return -1;
		const char *k = p + 1, *q = k;
		while (*q && *q != '"' && *q != '\\') q++;
		int plain = *q == '"';
		if (string(NULL, 0)) return -1;
		ws();
		if (*p++ != ':') return -1;
		ws();
		if (!plain)
			return -1;   /* an escape in a key: equal to KEY only decoded; rare */
		if ((size_t)(q - k) == n && !memcmp(k, key, n)) {
			if (found) return -1;
			found = p;
		}
		if (value(NULL, 0)) return -1;
		ws();
		if (*p == ',') { p++; ws(); continue; }
		if (*p++ != '}') return -1;
		break;
	}
	if (!found) return 0;
	p = found;
	return 1;
}

/* Moves p to element I of the array at p: 1 found, -1 fallback (bad
 * JSON, or out of range: Python's IndexError). */
static int element(long i)
{
	p++;
	ws();
	if (*p == ']') return -1;
	for (long at = 0;; at++) {
		if (at == i) return 1;
		if (value(NULL, 0)) return -1;
		ws();
		if (*p == ',') { p++; ws(); continue; }
		return -1;
	}
}

/* Reads stdin whole: a document is passed there, not in argv, whose
 * strings Linux caps at 128 KiB (the suites read bodies past 256 KiB). */
static int slurp(void)
{
	size_t cap = 1 << 16;
	if (!(doc = malloc(cap))) return -1;
	for (;;) {
		if (doclen + 1 >= cap && !(doc = realloc(doc, cap *= 2))) return -1;
		ssize_t r = read(0, doc + doclen, cap - doclen - 1);
		if (r < 0) return -1;
		if (r == 0) break;
		doclen += (size_t)r;
	}
	if (doclen && doc[doclen - 1] == '\n') doclen--;
	doc[doclen] = 0;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fputs("usage: jget PATH < JSON\n", stderr);
		return 64;
	}
	path = argv[1];
	if (slurp()) { perror("jget: stdin"); return 70; }
	/* the whole document must be JSON, as json.loads checks (a NUL
	 * inside is not, and would end the text here early) */
	if (strlen(doc) != doclen) fallback();
	p = doc;
	ws();
	const char *start = p;
	if (value(NULL, 0)) fallback();
	ws();
	if (*p) fallback();
	p = start;

	const char *k = path;
	for (;;) {
		const char *dot = strchr(k, '.');
		size_t n = dot ? (size_t)(dot - k) : strlen(k);
		if (*p == '[') {
			/* int(k): digits only here; a sign, blanks or "_" to Python */
			char *end;
			if (!n || k[0] < '0' || k[0] > '9') fallback();
			long i = strtol(k, &end, 10);
			if (end != k + n) fallback();
			if (element(i) != 1) fallback();
		} else if (*p == '{') {
			int r = member(k, n);
			if (r < 0) fallback();
			if (r == 0) { p = "null"; }
		} else {
			p = "null";   /* .get of a scalar or of None: None from here on */
		}
		if (!dot) break;
		k = dot + 1;
	}
	/* printed whole or not at all: a fallback half way must not follow
	 * half an answer */
	char *out = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&out, &len);
	if (!m) { perror("jget"); return 70; }
	if (value(m, 1)) fallback();
	fputc('\n', m);
	if (fclose(m)) { perror("jget"); return 70; }
	fwrite(out, 1, len, stdout);
	free(out);
	return fflush(stdout) || ferror(stdout) ? 70 : 0;
}
