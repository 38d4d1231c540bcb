/* util.h: small helpers with no better home: clocks, durations, the state
 * directory, growable buffers, reading whole files (lines: lines.h). */
#ifndef IK_UTIL_H
#define IK_UTIL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/err.h"

int64_t ik_now_ms(void);          /* wall clock, epoch milliseconds */
int64_t ik_mono_ms(void);         /* monotonic, for timeouts */
/* The boot clock (CLOCK_BOOTTIME) in ms: monotonic, counts a suspend too,
 * and the same clock for every process of one boot, so one process can
 * measure time since another read it (the claim's lease, envelope.h).
 * Comparable only with a reading of the same boot: see ik_boot_id. */
int64_t ik_boot_ms(void);
/* This boot's id (/proc/sys/kernel/random/boot_id, 36 characters), read
 * once per process; "" when it cannot be read. */
#define IK_BOOT_ID_MAX 37
const char *ik_boot_id(void);

/* Set by the signal handler (cli.h's ik_cli_init): the signal number that
 * asked us to stop. */
extern volatile sig_atomic_t ik_stop_signal;

/* Sleeps ms milliseconds.  A stop signal (ik_stop_signal, above) ends the
 * sleep early and returns -1, so a loop that waits can check it and finish
 * or roll back its record; any other signal resumes it.  0 when the whole
 * time passed. */
int ik_sleep_ms(int64_t ms);

/* Non-zero when the socket fd has something to read, an end of file or an
 * error now (a poll that does not wait).  On a connection kept between
 * commands, where no answer is due, that is the server closing it (a
 * restart, a kill, a fail-over, an idle timeout): the adapters look before
 * sending, and connect afresh while a retry is still safe. */
int ik_fd_ready(int fd);

/* pipe() with both ends close-on-exec (pipe2 is not POSIX), and both
 * non-blocking when nonblock (a self-pipe a signal handler writes to).
 * 0, or -1 with errno and nothing left open. */
int ik_cloexec_pipe(int fd[2], int nonblock);

/* Exponential backoff: the ceiling min(cap_ms, base_ms * 2^n) (n from 0),
 * and full jitter, a value uniform in [0, that ceiling]. */
int64_t ik_backoff_ceil(int64_t base_ms, int64_t cap_ms, int64_t n);
int64_t ik_backoff_jitter(int64_t base_ms, int64_t cap_ms, int64_t n);

/* "30", "30s", "500ms", "5m", "2h", "30d" -> milliseconds.  Plain numbers
 * are seconds.  Returns 0 and sets *ms, or -1 on a malformed or negative
 * value or one that would overflow. */
int ik_parse_duration(const char *s, int64_t *ms);
/* Strict base-10 integer in [min, max]; 0 or -1. */
int ik_parse_int(const char *s, long long min, long long max, long long *out);

/* The state directory: $IDEMKIT_STATE_DIR, else $XDG_STATE_HOME/idemkit,
 * else $HOME/.local/state/idemkit, else ./.idemkit.  Created (0700) when
 * create is set.  Returns a malloc'd path or NULL with err (IK_CONFIG). */
char *ik_state_dir(int create, ik_err *err);

/* A growable byte buffer, always NUL-terminated. */
struct ik_buf {
	char *p;
	size_t len, cap;
};
int ik_buf_add(struct ik_buf *b, const void *data, size_t n);  /* 0 / -1 ENOMEM */
int ik_buf_addstr(struct ik_buf *b, const char *s);
void ik_buf_reset(struct ik_buf *b);
void ik_buf_free(struct ik_buf *b);
/* For secrets: wipes the whole allocation (cap bytes, so what a realloc
 * left past len is wiped too), then frees; b is reusable. */
void ik_buf_wipe_free(struct ik_buf *b);
/* Wipes a NUL-terminated secret, then frees it; NULL is fine. */
void ik_str_wipe_free(char *s);

/* The whole file, NUL-terminated, trailing newlines stripped: IK_OK, or
 * IK_CONFIG with err when it cannot be read or is larger than max bytes
 * (IK_SOFTWARE when out of memory).  For secrets: the caller wipes and
 * frees. */
int ik_read_file(const char *path, size_t max, struct ik_buf *b, ik_err *err);
/* As ik_read_file, for a secret (a token, a key, a client secret): refused
 * (IK_CONFIG, the message naming the path and the fix, never a byte of
 * it) when the file is readable by group or others, as ssh does with a
 * private key; read into one allocation of max + 1 bytes, so no copy is
 * left behind; the caller wipes and frees (ik_buf_wipe_free). */
int ik_read_secret(const char *path, size_t max, struct ik_buf *b, ik_err *err);

/* Lower-case hex of n bytes into out (2n+1 bytes). */
void ik_hex(const unsigned char *in, size_t n, char *out);

/* A random id "8-4-4-4-12" (hex, version 4), as SQS's message ids read. */
void ik_uuid4(char out[37]);

/* strdup that accepts NULL. */
char *ik_strdup(const char *s);

#endif
