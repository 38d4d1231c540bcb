/* util.c: clocks, sleeps and backoffs, durations, the state directory,
 * buffers and their wipe, files. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "core/outcome.h"
#include "core/util.h"

int
ik_fd_ready(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return fd >= 0 && poll(&pfd, 1, 0) > 0;
}

int
ik_cloexec_pipe(int fd[2], int nonblock)
{
	if (pipe(fd) < 0)
		return -1;
	for (int i = 0; i < 2; i++)
		if (fcntl(fd[i], F_SETFD, FD_CLOEXEC) < 0 ||
		    (nonblock && fcntl(fd[i], F_SETFL, O_NONBLOCK) < 0)) {
			int e = errno;
			close(fd[0]);
			close(fd[1]);
			errno = e;
			return -1;
		}
	return 0;
}

int64_t
ik_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
ik_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
ik_boot_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *
ik_boot_id(void)
{
	static char id[IK_BOOT_ID_MAX];
	static int read_once;
	ssize_t n = -1;
	int fd;

	if (read_once)
		return id;
	read_once = 1;
	if ((fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC)) >= 0) {
		n = read(fd, id, sizeof id - 1);
		close(fd);
	}
	/* exactly a UUID, or nothing: a short read proves no boot */
	if (n < IK_BOOT_ID_MAX - 1 || strspn(id, "0123456789abcdef-") != IK_BOOT_ID_MAX - 1)
		n = 0;
	id[n > 0 ? IK_BOOT_ID_MAX - 1 : 0] = '\0';
	return id;
}

volatile sig_atomic_t ik_stop_signal;

int
ik_sleep_ms(int64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };

	if (ms <= 0)
		return ik_stop_signal ? -1 : 0;
	while (nanosleep(&ts, &ts) < 0) {
		if (errno != EINTR || ik_stop_signal)
			return -1;
	}
	return ik_stop_signal ? -1 : 0;
}

int64_t
ik_backoff_ceil(int64_t base_ms, int64_t cap_ms, int64_t n)
{
	int64_t ceil = base_ms;

	while (n-- > 0 && ceil > 0 && ceil < cap_ms)
		ceil *= 2;
	return ceil > cap_ms ? cap_ms : ceil;
}

int64_t
ik_backoff_jitter(int64_t base_ms, int64_t cap_ms, int64_t n)
{
	int64_t ceil = ik_backoff_ceil(base_ms, cap_ms, n);

	if (ceil <= 0)
		return 0;
	if (ceil >= UINT32_MAX)
		ceil = UINT32_MAX - 1;
	return (int64_t)randombytes_uniform((uint32_t)ceil + 1);
}

int
ik_parse_int(const char *s, long long min, long long max, long long *out)
{
	char *end;
	long long v;

	if (!s || !*s || (*s != '-' && (*s < '0' || *s > '9')))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

int
ik_parse_duration(const char *s, int64_t *ms)
{
	static const struct { const char *sfx; int64_t mul; } units[] = {
		{ "ms", 1 }, { "s", 1000 }, { "", 1000 }, { "m", 60000 },
		{ "h", 3600000 }, { "d", 86400000 },
	};
	char *end;
	long long v;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || v < 0)
		return -1;
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strcmp(end, units[i].sfx) == 0) {
			if (v > INT64_MAX / units[i].mul)
				return -1;
			*ms = v * units[i].mul;
			return 0;
		}
	}
	return -1;
}

static int
mkdir_p(char *path, mode_t mode)
{
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(path, mode) < 0 && errno != EEXIST) {
			*p = '/';
			return -1;
		}
		*p = '/';
	}
	if (mkdir(path, mode) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

char *
ik_state_dir(int create, ik_err *err)
{
	const char *d = getenv("IDEMKIT_STATE_DIR"), *base;
	struct ik_buf b = { 0 };

	if (d && *d) {
		ik_buf_addstr(&b, d);
	} else if ((base = getenv("XDG_STATE_HOME")) && *base == '/') {
		ik_buf_addstr(&b, base);
		ik_buf_addstr(&b, "/idemkit");
	} else if ((base = getenv("HOME")) && *base == '/') {
		ik_buf_addstr(&b, base);
		ik_buf_addstr(&b, "/.local/state/idemkit");
	} else {
		ik_buf_addstr(&b, ".idemkit");
	}
	if (!b.p) {
		ik_errf(err, IK_SOFTWARE, "out of memory");
		return NULL;
	}
	if (create && mkdir_p(b.p, 0700) < 0) {
		ik_errf(err, IK_CONFIG, "state directory %s: %s", b.p, strerror(errno));
		ik_buf_free(&b);
		return NULL;
	}
	return b.p;
}

int
ik_buf_add(struct ik_buf *b, const void *data, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;
		while (cap < b->len + n + 1) {
			if (cap > SIZE_MAX / 2)
				return -1;
			cap *= 2;
		}
		if (!(p = realloc(b->p, cap)))
			return -1;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

int
ik_buf_addstr(struct ik_buf *b, const char *s)
{
	return ik_buf_add(b, s, strlen(s));
}

void
ik_buf_reset(struct ik_buf *b)
{
	b->len = 0;
	if (b->p)
		b->p[0] = '\0';
}

void
ik_buf_free(struct ik_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

void
ik_buf_wipe_free(struct ik_buf *b)
{
	if (b->p)
		sodium_memzero(b->p, b->cap);
	ik_buf_free(b);
}

void
ik_str_wipe_free(char *s)
{
	if (s) {
		sodium_memzero(s, strlen(s));
		free(s);
	}
}

/* The rest of fd into b (reset first), at most max bytes; the chunk it
 * passes through is wiped, as what it read may be a secret. */
static int
read_fd(int fd, const char *path, size_t max, struct ik_buf *b, ik_err *err)
{
	char chunk[4096];
	ssize_t n;
	int rc = IK_OK;

	ik_buf_reset(b);
	while ((n = read(fd, chunk, sizeof chunk)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = ik_errf(err, IK_CONFIG, "%s: %s", path, strerror(errno));
			break;
		}
		if (b->len + (size_t)n > max) {
			rc = ik_errf(err, IK_CONFIG, "%s: larger than %zu bytes", path, max);
			break;
		}
		if (ik_buf_add(b, chunk, (size_t)n) < 0) {
			rc = ik_errf(err, IK_SOFTWARE, "out of memory");
			break;
		}
	}
	sodium_memzero(chunk, sizeof chunk);
	close(fd);
	if (rc != IK_OK)
		return rc;
	if (!b->p && ik_buf_add(b, "", 0) < 0)
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	while (b->len && (b->p[b->len - 1] == '\n' || b->p[b->len - 1] == '\r'))
		b->p[--b->len] = '\0';
	return IK_OK;
}

int
ik_read_file(const char *path, size_t max, struct ik_buf *b, ik_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return ik_errf(err, IK_CONFIG, "%s: %s", path, strerror(errno));
	return read_fd(fd, path, max, b, err);
}

int
ik_read_secret(const char *path, size_t max, struct ik_buf *b, ik_err *err)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return ik_errf(err, IK_CONFIG, "%s: %s", path, strerror(errno));
	/* The mode of what was opened, not of a path that may change. */
	if (fstat(fd, &st) != 0 || (st.st_mode & (S_IRWXG | S_IRWXO))) {
		close(fd);
		return ik_errf(err, IK_CONFIG, "%s: readable by group or others (mode %03o); "
		               "chmod 600 it", path, (unsigned)(st.st_mode & 0777));
	}
	/* All of it in one allocation: a buffer that grows leaves copies of
	 * the secret behind in what realloc freed. */
	ik_buf_wipe_free(b);
	if (!(b->p = malloc(max + 1))) {
		close(fd);
		return ik_errf(err, IK_SOFTWARE, "out of memory");
	}
	b->cap = max + 1;
	return read_fd(fd, path, max, b, err);
}

void
ik_hex(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

char *
ik_strdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

void
ik_uuid4(char out[37])
{
	unsigned char r[16];
	char h[33];

	randombytes_buf(r, sizeof r);
	r[6] = (unsigned char)((r[6] & 0x0f) | 0x40);
	r[8] = (unsigned char)((r[8] & 0x3f) | 0x80);
	ik_hex(r, sizeof r, h);
	snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16, h + 20);
}
