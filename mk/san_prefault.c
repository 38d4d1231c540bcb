/*
 * mk/san_prefault.c: linked into the sanitizer build's programs only
 * (make sanitize), never into what make install ships.
 *
 * LeakSanitizer's check at each exit reads every writable global of the
 * program, and clang links the ASan runtime in statically: ~9.8 MB of its
 * own zeroed globals (tables it mostly never writes), read a 4 KiB page at a
 * time, a page fault each (~2 400).  On this project's CI machines a page
 * fault is dear (a VM that traps each one: ~20-45 us), and the suite starts
 * ~12 000 sanitized processes, so those faults were about a quarter of each
 * one's CPU (measured with perf stat: 64 -> 49 ms a process for
 * idemp-claim --help, page faults 3 180 -> 990).
 *
 * So at start-up the zeroed globals are marked for transparent huge pages
 * and their untouched pages mapped at once to the zero page (one call, not
 * one fault a page).  Nothing is written: what the sanitizers see and report
 * is unchanged.  Where the kernel lacks either advice (before 5.14) the call
 * fails and nothing changes.
 */
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

extern char __bss_start[], _end[];

__attribute__((constructor)) static void
san_prefault(void)
{
	const uintptr_t page = 4096;
	uintptr_t a = ((uintptr_t)__bss_start + page - 1) & ~(page - 1);
	uintptr_t e = (uintptr_t)_end & ~(page - 1);

	if (e <= a)
		return;
	(void)madvise((void *)a, e - a, MADV_HUGEPAGE);
	(void)madvise((void *)a, e - a, MADV_POPULATE_READ);
}
