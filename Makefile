# idemkit: one static library (lib/) and one small binary per cmd/*.c.
# Shell commands are cmd/*.sh, installed without the suffix.
# Build output goes to $(O) (default build/), so the sanitizer build
# (O=build/san) lives beside the normal one.

.DELETE_ON_ERROR:
.SECONDARY:
.SUFFIXES:

PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
DESTDIR ?=
O       ?= build
CC      ?= cc
CFLAGS  ?= -O2 -g
VERSION := 0.1.0

# pkg-config name : Debian package that provides it
DEPS := libcurl:libcurl4-openssl-dev libcjson:libcjson-dev \
        libsodium:libsodium-dev sqlite3:libsqlite3-dev \
        libmicrohttpd:libmicrohttpd-dev
PKGS := $(foreach d,$(DEPS),$(word 1,$(subst :, ,$(d))))

# Debian packages per kind of target; mk/deps.sh installs the missing ones
# (CMD:PACKAGE: only when CMD is not on PATH already).  `make demo` and
# `make test` call it first, so each works on a fresh machine by itself.
DEBS_BUILD := make gcc pkg-config $(foreach d,$(DEPS),$(word 2,$(subst :, ,$(d))))
DEBS_DEMO  := python3 curl procps util-linux
DEBS_TEST  := $(DEBS_DEMO) bats clang libclang-rt-14-dev sqlite3 mandoc python3-botocore \
              python3-prometheus-client promtool:prometheus \
              shellcheck valgrind openssl node:nodejs npm:npm

# The README's two commands and `deps` need no libraries to parse this file.
NODEPS_GOALS := clean deps help demo test
ifeq ($(filter $(NODEPS_GOALS),$(MAKECMDGOALS)),)
MISSING := $(foreach d,$(DEPS),$(if $(shell pkg-config --exists $(word 1,$(subst :, ,$(d))) 2>/dev/null && echo y),,$(word 2,$(subst :, ,$(d)))))
ifneq ($(strip $(MISSING)),)
$(error missing libraries; install them with: apt-get install $(MISSING)   (or: make test, make demo, make deps, which install them as root))
endif
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
endif

# -Werror in a git checkout (developers, CI); a packager's build from a
# release tarball gets the warnings without failing on a newer compiler's.
WERROR ?= $(if $(wildcard $(CURDIR)/.git),-Werror)

IK_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
             -DIK_VERSION='"$(VERSION)"' -Ilib $(PKG_CFLAGS) \
             -Wall -Wextra $(WERROR) -Wshadow -Wstrict-prototypes \
             -Wno-unused-parameter -MMD -MP
IK_LDFLAGS := -Wl,--as-needed
LDLIBS += $(PKG_LIBS) -lm

LIB_SRC  := $(wildcard lib/*.c)
LIB_OBJ  := $(patsubst lib/%.c,$(O)/obj/lib/%.o,$(LIB_SRC))
CMD_SRC  := $(wildcard cmd/*.c)
CMDS     := $(patsubst cmd/%.c,%,$(CMD_SRC))
SCRIPTS  := $(patsubst cmd/%.sh,%,$(wildcard cmd/*.sh))
BINS     := $(addprefix $(O)/bin/,$(CMDS) $(SCRIPTS))
MANS     := $(wildcard man/*.[1-8])
UNIT_SRC := $(wildcard tests/unit/*.c)
UNITS    := $(patsubst tests/unit/%.c,$(O)/test/%,$(UNIT_SRC))
REPLAYS  := $(patsubst tests/fuzz/fuzz_%.c,$(O)/test/replay_%,$(wildcard tests/fuzz/fuzz_*.c))
LIBA     := $(O)/lib/libidemkit.a

SAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
             -fno-sanitize-recover=undefined

all: $(BINS)

$(O)/obj/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(O)/obj/cmd/%.o: cmd/%.c
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(LIBA): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $(LIB_OBJ)

$(O)/bin/%: $(O)/obj/cmd/%.o $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $< $(LIBA) $(LDLIBS)

$(O)/bin/%: cmd/%.sh
	@mkdir -p $(@D)
	sed 's/@VERSION@/$(VERSION)/g' $< > $@
	chmod 755 $@

# C unit tests (tests/unit/NAME.c -> $(O)/test/NAME), run from the bats suites.
$(O)/test/%: tests/unit/%.c $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $< $(LIBA) $(LDLIBS)

# Each fuzz target also built with a plain main (tests/fuzz/replay.c), so
# tests/fuzz.bats replays the corpora and the regressions without libFuzzer.
$(O)/test/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(LIBA)
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $< tests/fuzz/replay.c $(LIBA) $(LDLIBS)

# The test suites run the binaries in $(O)/bin; IDEMKIT_TEST_JOBS runs
# bats files in parallel when GNU parallel is present (it is optional).
TEST_ENV = IDEMKIT_BIN=$(CURDIR)/$(O)/bin IDEMKIT_TEST_BIN=$(CURDIR)/$(O)/test IDEMKIT_SRC=$(CURDIR)

# The README's two commands: install what is missing, then the real target.
test:
	@sh mk/deps.sh $(DEBS_BUILD) $(DEBS_TEST)
	@$(MAKE) --no-print-directory check
demo:
	@sh mk/deps.sh $(DEBS_BUILD) $(DEBS_DEMO)
	@$(MAKE) --no-print-directory demo-embedded

# The emulators the tests start (dynalite, local-aws-sqs), from the lockfile.
NODE_STAMP := node_modules/.package-lock.json
$(NODE_STAMP): package-lock.json package.json
	npm ci --no-audit --no-fund --loglevel=error

check: all $(UNITS) $(REPLAYS) $(NODE_STAMP)
	$(TEST_ENV) sh tests/run.sh tests/ \
	  'IDEMKIT_TEST_BACKEND=dynamodb tests/store.bats' \
	  'IDEMKIT_TEST_BACKEND=dynamodb tests/idemp-stats.bats' \
	  'IDEMKIT_TEST_QUEUE_BACKEND=sqs tests/queue.bats'

# ASan + UBSan build of everything, then the whole suite against it.  Reports
# go to files too, so one from a process whose exit status a test ignores
# still fails the run.
SAN_LOG := $(CURDIR)/build/san/report
sanitize:
	rm -f $(SAN_LOG).*
	ASAN_OPTIONS=log_path=$(SAN_LOG):detect_leaks=1 \
	UBSAN_OPTIONS=log_path=$(SAN_LOG):print_stacktrace=1 \
	$(MAKE) O=build/san CC=clang CFLAGS='$(SAN_FLAGS)' LDFLAGS='-fsanitize=address,undefined' check
	@if ls $(SAN_LOG).* >/dev/null 2>&1; then cat $(SAN_LOG).*; echo 'sanitizer reports above'; exit 1; fi
	@echo 'sanitize: no reports'

# End-to-end throughput, CPU per charge, latency and duplicates on this
# machine (bench/bench.py; BENCH_N etc. there).  Not part of `make test`.
bench: all $(NODE_STAMP)
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin BENCH_OUT=$(CURDIR)/$(O)/bench python3 bench/bench.py

# libFuzzer targets (tests/fuzz/fuzz_NAME.c) over the parsers, built with
# clang against an instrumented copy of the library; each runs FUZZ_TIME
# seconds from its corpus.  Crashes land in build/fuzz/ and become tests.
FUZZ_TIME ?= 60
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_FLAGS := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined
fuzz:
	$(MAKE) O=build/fuzz CC=clang CFLAGS='$(FUZZ_FLAGS)' build/fuzz/lib/libidemkit.a
	@set -e; for src in $(FUZZ_SRC); do \
	  name=$$(basename $$src .c); t=$${name#fuzz_}; \
	  clang $(IK_CFLAGS) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -o build/fuzz/$$name $$src \
	    build/fuzz/lib/libidemkit.a $(LDLIBS); \
	  mkdir -p build/fuzz/corpus-$$t; \
	  echo "== $$name for $(FUZZ_TIME)s"; \
	  build/fuzz/$$name -max_total_time=$(FUZZ_TIME) -max_len=4096 -timeout=10 \
	    -artifact_prefix=build/fuzz/$$name- build/fuzz/corpus-$$t tests/fuzz/corpus/$$t $$(ls -d tests/fuzz/regress/$$t 2>/dev/null) \
	    2>build/fuzz/$$name.log || { tail -40 build/fuzz/$$name.log; exit 1; }; \
	  tail -1 build/fuzz/$$name.log; \
	done

# The short run CI makes: every target for 10 seconds.
fuzz-short:
	$(MAKE) fuzz FUZZ_TIME=10

# The fault suites (tests/faults/): duplicate storm on both backends,
# kill -9 at every step boundary, outages, poison.  Minutes, not seconds;
# the measured numbers land in $(O)/faults-report.txt.
FAULTS_REPORT := $(CURDIR)/$(O)/faults-report.txt
faults: all $(NODE_STAMP)
	@mkdir -p $(O); rm -f $(FAULTS_REPORT)
	$(TEST_ENV) IDEMKIT_FAULTS_REPORT=$(FAULTS_REPORT) BATS_TEST_TIMEOUT=1200 sh tests/run.sh tests/faults/
	@cat $(FAULTS_REPORT)

# memcheck on a sample run of every C command (tests/valgrind.sh).
valgrind: all $(NODE_STAMP)
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin IDEMKIT_SRC=$(CURDIR) sh tests/valgrind.sh

demo-embedded: all
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin sh examples/demo.sh

demo-aws: all $(NODE_STAMP)
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin DEMO_BACKEND=aws sh examples/demo.sh

install: all
	mkdir -p $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man7
	for b in $(CMDS) $(SCRIPTS); do install -m 755 $(O)/bin/$$b $(DESTDIR)$(BINDIR)/$$b; done
	for m in $(MANS); do s=$${m##*.}; install -m 644 $$m $(DESTDIR)$(MANDIR)/man$$s/; done

uninstall:
	for b in $(CMDS) $(SCRIPTS); do rm -f $(DESTDIR)$(BINDIR)/$$b; done
	for m in $(MANS); do s=$${m##*.}; rm -f $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; done

# Installs the build and test dependencies on Debian (run as root).
deps:
	sh mk/deps.sh $(DEBS_BUILD) $(DEBS_TEST)

clean:
	rm -rf build

help:
	@echo 'targets: all test check demo demo-embedded sanitize faults fuzz fuzz-short valgrind bench demo demo-aws install uninstall deps clean'

.PHONY: all test check demo-embedded sanitize faults fuzz fuzz-short valgrind bench demo demo-aws install uninstall deps clean help

-include $(LIB_OBJ:.o=.d) $(patsubst cmd/%.c,$(O)/obj/cmd/%.d,$(CMD_SRC)) $(UNITS:=.d)
