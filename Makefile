# idemkit: one static library (lib/, a folder per port and per shared
# concern: lib/*/*.c, and an adapter's own folder, lib/*/*/*.c) and one
# small binary per cmd/*.c.
# Shell commands are cmd/*.sh, installed without the suffix.
# Build output goes to $(O) (default build/), so the sanitizer build
# (O=build/san) lives beside the normal one.

.DELETE_ON_ERROR:
.SECONDARY:
.SUFFIXES:

PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/idemkit
UNITDIR ?= $(PREFIX)/lib/systemd/system
# /etc whatever the prefix: the units, the crontab and the man pages name
# /etc/idemkit/idemkit.env.
SYSCONFDIR ?= /etc
DESTDIR ?=
O       ?= build
CC      ?= cc
CFLAGS  ?= -O2 -g
VERSION := 0.1.0

# pkg-config name : Debian package that provides it
DEPS := libcurl:libcurl4-openssl-dev libcjson:libcjson-dev \
        libsodium:libsodium-dev sqlite3:libsqlite3-dev \
        hiredis:libhiredis-dev libpq:libpq-dev librabbitmq:librabbitmq-dev
# The simulator's own (sim/, below): never needed by the product.
SIM_DEPS := libmicrohttpd:libmicrohttpd-dev gnutls:libgnutls28-dev
PKG_CONFIG ?= pkg-config
PKGS := $(foreach d,$(DEPS),$(word 1,$(subst :, ,$(d))))
# Loaded with dlopen on first use (lib/dl/dl.h): their headers, never their
# link flags, so a process that does not use them does not load them.
DL_PKGS := libcurl hiredis libpq librabbitmq

# Debian packages per kind of target; mk/deps.sh installs the missing ones
# (CMD:PACKAGE: only when CMD is not on PATH already).  `make demo` and
# `make test` call it first, so each works on a fresh machine by itself.
DEBS_BUILD := make gcc pkg-config libjq-dev $(foreach d,$(DEPS),$(word 2,$(subst :, ,$(d))))
DEBS_SIM   := $(foreach d,$(SIM_DEPS),$(word 2,$(subst :, ,$(d))))
DEBS_DEMO  := $(DEBS_SIM) python3 curl procps util-linux
# the fault campaign's hosts: namespaces and veths (iproute2), partitions
# (nftables), clocks (faketime); before DEBS_TEST, whose := reads it (it
# read an empty one, so make test left nftables to chaos-ci's apt-get)
DEBS_CHAOS := nft:nftables ip:iproute2 faketime
DEBS_TEST  := $(DEBS_DEMO) bats clang libclang-rt-14-dev sqlite3 mandoc python3-botocore \
              python3-prometheus-client promtool:prometheus \
              shellcheck valgrind openssl redis-server postgresql rabbitmq-server spin node:nodejs npm:npm faketime \
              python3-jsonschema jq bash-builtins \
              java:openjdk-17-jre-headless parallel $(DEBS_CHAOS)
DEBS_DEB   := dpkg-dev debhelper fakeroot lintian debootstrap

# The README's two commands and `deps` need no libraries to parse this file.
NODEPS_GOALS := clean deps help demo test model deb check-runs
ifeq ($(filter $(NODEPS_GOALS),$(MAKECMDGOALS)),)
MISSING := $(foreach d,$(DEPS),$(if $(shell $(PKG_CONFIG) --exists $(word 1,$(subst :, ,$(d))) 2>/dev/null && echo y),,$(word 2,$(subst :, ,$(d)))))
ifneq ($(strip $(MISSING)),)
$(error missing libraries; install them with: apt-get install $(MISSING)   (or: make test, make demo, make deps, which install them as root))
endif
PKG_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(PKGS))
PKG_LIBS   := $(shell $(PKG_CONFIG) --libs $(filter-out $(DL_PKGS),$(PKGS)))
# libjq (the bank request/response mapping): Debian's libjq-dev ships no
# pkg-config file, so it is found by its header and linked as -ljq.
ifeq ($(shell printf '\043include <jq.h>\n' | $(CC) $(CPPFLAGS) -E - >/dev/null 2>&1 && echo y),)
$(error missing libraries; install them with: apt-get install libjq-dev   (or, as root: make deps))
endif
endif

# -Werror in a git checkout (developers, CI); a packager's build from a
# release tarball gets the warnings without failing on a newer compiler's.
WERROR ?= $(if $(wildcard $(CURDIR)/.git),-Werror)

IK_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
             -DIK_VERSION='"$(VERSION)"' -Ilib $(PKG_CFLAGS) \
             -Wall -Wextra $(WERROR) -Wshadow -Wstrict-prototypes \
             -Wno-unused-parameter -MMD -MP
IK_LDFLAGS := -Wl,--as-needed
LDLIBS += $(PKG_LIBS) -ljq -lm

# Each object's name is its source's (the archive keeps a member by its
# name alone: tests/layout.bats checks that no two lib sources share one).
LIB_SRC  := $(wildcard lib/*/*.c lib/*/*/*.c)
LIB_OBJ  := $(patsubst lib/%.c,$(O)/obj/lib/%.o,$(LIB_SRC))
CMD_SRC  := $(wildcard cmd/*.c)
CMDS     := $(patsubst cmd/%.c,%,$(CMD_SRC))
SCRIPTS  := $(patsubst cmd/%.sh,%,$(wildcard cmd/*.sh))
BINS     := $(addprefix $(O)/bin/,$(CMDS) $(SCRIPTS))
MANS     := $(wildcard man/*.[1-8])
UNIT_SRC := $(wildcard tests/unit/*.c)
UNITS    := $(patsubst tests/unit/%.c,$(O)/test/%,$(UNIT_SRC))
# The suites' own tools in C (tests/tools/NAME.c -> $(O)/test/NAME): what a
# test calls thousands of times, where a python3 start per call was most of
# the suite's CPU.  They use none of the product's code.
TOOLS    := $(patsubst tests/tools/%.c,$(O)/test/%,$(wildcard tests/tools/*.c))
REPLAYS  := $(patsubst tests/fuzz/fuzz_%.c,$(O)/test/replay_%,$(wildcard tests/fuzz/fuzz_*.c))
# SHARED=1 (tests/mutants/run.sh's scratch trees): the library a shared
# object the programs find beside them ($ORIGIN/../lib), an order-only
# prerequisite, so a mutant of lib/ rebuilds one object and one link, not
# the ~35 programs a static archive makes it relink (measured 2026-12-06:
# 4.5 CPU-s a mutant of the ~10 its whole run costs).  Never installed.
ifeq ($(SHARED),1)
LIBA     := $(O)/lib/libidemkit.so
LIB_PIC  := -fPIC
LIB_DEP   = | $(LIBA)
LIB_LINK  = -L$(O)/lib -lidemkit -Wl,-rpath,'$$ORIGIN/../lib'
else
LIBA     := $(O)/lib/libidemkit.a
LIB_DEP   = $(LIBA)
LIB_LINK  = $(LIBA)
endif

comma := ,
SAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
             -fno-sanitize-recover=undefined

all: product sim

# The product alone: what `make install` ships; needs no libmicrohttpd.
product: $(BINS)

$(O)/obj/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LIB_PIC) -c -o $@ $<

$(O)/obj/cmd/%.o: cmd/%.c
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(O)/lib/libidemkit.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $(LIB_OBJ)

$(O)/lib/libidemkit.so: $(LIB_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared $(CFLAGS) $(LDFLAGS) -Wl,-soname,libidemkit.so -o $@ $(LIB_OBJ) $(LDLIBS)

$(O)/bin/%: $(O)/obj/cmd/%.o $(LINK_EXTRA) $(LIB_DEP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $< $(LINK_EXTRA) $(LIB_LINK) $(LDLIBS)

$(O)/bin/%: cmd/%.sh
	@mkdir -p $(@D)
	sed 's/@VERSION@/$(VERSION)/g' $< > $@
	chmod 755 $@

# C unit tests (tests/unit/NAME.c -> $(O)/test/NAME), run from the bats suites.
# Compiled to an object once and linked again when the library changes: a
# seeded mutant (make mutants) rebuilds one file of lib/ and then relinks,
# where compiling ~30 test programs again was most of each mutant's build.
$(O)/obj/tests/%.o: tests/%.c
	@mkdir -p $(@D)
	$(CC) $(IK_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# (kept: an intermediate object would be deleted after the build, and
# compiled again at the next relink)
.SECONDARY: $(patsubst tests/%.c,$(O)/obj/tests/%.o,$(UNIT_SRC) $(wildcard tests/fuzz/*.c))
$(O)/test/%: $(O)/obj/tests/unit/%.o $(LINK_EXTRA) $(LIB_DEP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $< $(LINK_EXTRA) $(LIB_LINK) $(LDLIBS)

# (the tools are the suite's instruments, not our C: built plain in every
# build, the sanitizer's too, where each of the thousands of jget calls
# cost ~50 ms more under ASan and LeakSanitizer; tests/ci.bats checks jget
# against Python)
$(O)/test/%: tests/tools/%.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra $(WERROR) -Wshadow $(CPPFLAGS) -O2 -g -o $@ $<

# Each fuzz target also built with a plain main (tests/fuzz/replay.c), so
# tests/fuzz.bats replays the corpora and the regressions without libFuzzer.
$(O)/test/replay_%: $(O)/obj/tests/fuzz/fuzz_%.o $(O)/obj/tests/fuzz/replay.o $(LINK_EXTRA) $(LIB_DEP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB_LINK) $(LDLIBS)

# LINK_EXTRA: objects linked into every program of a build besides its own
# (make sanitize: mk/san_prefault.c, which spares LeakSanitizer's exit scan
# a page fault per 4 KiB of the ASan runtime's zeroed globals).
$(O)/obj/mk/%.o: mk/%.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -Wall -Wextra $(WERROR) -O2 -c -o $@ $<

# The test suites run the binaries in $(O)/bin, several runs at once
# (tests/run.sh: IDEMKIT_TEST_JOBS, IDEMKIT_TEST_FILE_JOBS), the slowest
# first by the times the last run of the same build left in $(O)/test-times.
TEST_ENV = IDEMKIT_BIN=$(CURDIR)/$(O)/bin IDEMKIT_TEST_BIN=$(CURDIR)/$(O)/test IDEMKIT_SRC=$(CURDIR) \
           IDEMKIT_TEST_TIMES=$(CURDIR)/$(O)/test-times IDEMKIT_TEST_CPU=$(CURDIR)/$(O)/test-cpu

# The builds that test, sanitize and fuzz start use every core (unless make
# was given -j: its jobserver is shared then).
NPROC   := $(shell nproc 2>/dev/null || echo 2)
SUBJOBS  = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(NPROC))

# The README's two commands: install what is missing, then the real target.
# `make test SANITIZE=1`: the same suite, every run once, in one schedule:
# the runs of make sanitize's set cover (every line of our C the suite
# runs) on the ASan + UBSan build, the others on the plain build (make
# sanitize SAN_REST=1): CI's one pass (.ci/run), so that no run is made
# twice.  Measured 2026-12-05 on 2 cores: every run sanitized took 2 411 s
# (3 310 s of CPU); a process of ours costs 65 ms more under ASan, 43 of
# them LeakSanitizer's scan at exit.
test:
	@sh mk/deps.sh $(DEBS_BUILD) $(DEBS_TEST)
	@$(MAKE) --no-print-directory $(SUBJOBS) $(if $(filter 1,$(SANITIZE)),sanitize SAN_REST=1,check)
demo:
	@sh mk/deps.sh $(DEBS_BUILD) $(DEBS_DEMO)
	@$(MAKE) --no-print-directory demo-embedded

# The emulators the tests start (dynalite, local-aws-sqs), from the lockfile.
NODE_STAMP := node_modules/.package-lock.json
$(NODE_STAMP): package-lock.json package.json
	npm ci --no-audit --no-fund --loglevel=error

check-build: all $(UNITS) $(TOOLS) $(REPLAYS)
# The slowest runs are named first, slowest first by a CI run's times, so
# they start first on a fresh clone (tests/run.sh; later runs go by
# $(O)/test-times): a long run that starts last is the whole run's tail.
CHECK_RUNS := tests/charge-worker.bats tests/aws-creds.bats tests/charge-debit.bats \
	'IDEMKIT_TEST_BACKEND=postgres tests/idemp-run.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb-local tests/idemp-run.bats' \
	tests/metrics.bats tests/postgres.bats \
	'IDEMKIT_TEST_BACKEND=dynamodb-local tests/outbox.bats' \
	tests/model.bats \
	'IDEMKIT_TEST_BACKEND=dynamodb tests/idemp-run.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb tests/outbox.bats' \
	'IDEMKIT_TEST_BACKEND=sqlite-cache tests/idemp-run.bats' \
	'IDEMKIT_TEST_BACKEND=redis tests/idemp-run.bats' \
	tests/idemp-run.bats \
	'IDEMKIT_TEST_BACKEND=postgres tests/outbox.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb-local tests/outbox-dynamodb.bats' \
	'IDEMKIT_TEST_BACKEND=postgres tests/store.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb-local tests/store.bats' \
	'IDEMKIT_TEST_BACKEND=redis tests/outbox.bats' \
	tests/outbox.bats \
	'IDEMKIT_TEST_QUEUE_BACKEND=sqs tests/outbox.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb tests/store.bats' \
	'IDEMKIT_TEST_BACKEND=sqlite-cache tests/store.bats' \
	'IDEMKIT_TEST_BACKEND=redis tests/store.bats' \
	'IDEMKIT_TEST_QUEUE_BACKEND=sqs tests/queue.bats' \
	'IDEMKIT_TEST_QUEUE_BACKEND=amqp tests/queue.bats' tests/amqp.bats \
	'IDEMKIT_TEST_BACKEND=dynamodb-local tests/dynamodb.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb-local tests/ddb-inflight.bats' \
	'IDEMKIT_TEST_BACKEND=dynamodb tests/idemp-stats.bats' \
	'IDEMKIT_TEST_BACKEND=postgres tests/idemp-stats.bats' \
	'IDEMKIT_TEST_BACKEND=redis tests/idemp-stats.bats' \
	tests/
check: check-build $(NODE_STAMP)
	$(TEST_ENV) sh tests/run.sh $(CHECK_RUNS)
# The runs make check makes, one a line (tests/ci.bats, make sanitize).
check-runs:
	@sh tests/run.sh --list $(CHECK_RUNS)

# ASan + UBSan build of everything, then the suites against it: not the
# whole suite again, but the fewest tests that still execute every line of
# our C that the whole suite executes (tests/sancover.py: a greedy set
# cover, lines per second of test, from tests/san-cover.txt, which `make
# san-cover` renews and tests/ci.bats checks is not stale), plus any run or
# test that list has not seen; a sanitized run's other tests go plain
# (tests/helper.bash, by build/san/plain-tests).  SAN_ALL=1: every run.
# Measured at the list's making (2026-12-06): 13 876 lines, 357 of 1 032
# tests in 64 of 73 runs, 27 % of the tests' time; make test SANITIZE=1
# 2 394 CPU-s and 1 450 s where the cover by file (58 runs whole) took
# 3 015 and 1 651.
# Reports go to files too, so one from a process whose exit status a test
# ignores still fails the run.
SAN_LOG   := $(CURDIR)/build/san/report
SAN_COVER := tests/san-cover.txt
sanitize:
	rm -f $(SAN_LOG).* build/san/plain-runs build/san/plain-tests
	@# the plain build too: the tests that preload libfaketime run it
	@# (tests/helper.bash's slow_or_skip), which an ASan build cannot start
	@# under, the tests of a sanitized run the set cover leaves out, and
	@# SAN_REST=1 the runs it leaves out
	$(MAKE) $(SUBJOBS) check-build
	@mkdir -p build/san
	sh tests/run.sh --list $(CHECK_RUNS) > build/san/all-runs
	$(if $(SAN_ALL),cp build/san/all-runs build/san/runs; : > build/san/plain-tests,python3 tests/sancover.py select $(SAN_COVER) build/san/all-runs build/san/plain-tests > build/san/runs)
	$(if $(SAN_REST),grep -Fvx -f build/san/runs build/san/all-runs > build/san/plain-runs || true)
	$(if $(SAN_REST),cp build/san/all-runs build/san/runs)
	@echo "sanitize: $$(($$(wc -l < build/san/runs) - $$(cat build/san/plain-runs 2>/dev/null | wc -l))) of $$(wc -l < build/san/all-runs) runs$(if $(SAN_REST),$(comma) the others on the plain build,) (make test runs them all), $$(wc -l < build/san/plain-tests) of their tests on the plain build (the set cover's, by test)"
	@# a fresh clone: the slowest first by the coverage run's times
	@[ -s build/san/test-times ] || awk '$$1 == "run" { t = $$3; sub(/^run [0-9]+ [0-9]+ /, ""); print t, $$0 }' \
	  $(SAN_COVER) | sort -nr > build/san/test-times
	ASAN_OPTIONS=log_path=$(SAN_LOG):detect_leaks=1 \
	UBSAN_OPTIONS=log_path=$(SAN_LOG):print_stacktrace=1 \
	IDEMKIT_TEST_ONLY=$(CURDIR)/build/san/runs IDEMKIT_PLAIN_BIN=$(CURDIR)/build/bin \
	IDEMKIT_PLAIN_TEST_BIN=$(CURDIR)/build/test IDEMKIT_SAN_PLAIN_TESTS=$(CURDIR)/build/san/plain-tests \
	$(if $(SAN_REST),IDEMKIT_TEST_PLAIN=$(CURDIR)/build/san/plain-runs) \
	$(MAKE) $(SUBJOBS) O=build/san CC=clang CFLAGS='$(SAN_FLAGS)' LDFLAGS='-fsanitize=address,undefined' \
	  LINK_EXTRA=build/san/obj/mk/san_prefault.o check
	@if ls $(SAN_LOG).* >/dev/null 2>&1; then cat $(SAN_LOG).*; echo 'sanitizer reports above'; exit 1; fi
	@echo 'sanitize: no reports'

# Renews tests/san-cover.txt: every run of make check on a --coverage
# build (-O0 for exact lines; WERROR off: gcc warns differently at -O0),
# each run's gcov data apart (tests/run.sh's IDEMKIT_TEST_GCOV), then the
# lines of lib/, cmd/ and sim/ each run executed.  A red test here only
# loses its lines (make test is where tests are judged).  Not the spin
# model (SAN_COVER_SKIP: its C is spin's, not ours; it is noted as covering
# nothing).  Half an hour at load 20: longer than make test (-O0, gcov).
SAN_COVER_SKIP := tests/model.bats
COV_MAKE = $(MAKE) $(SUBJOBS) O=build/cov WERROR= CFLAGS='-O0 -g --coverage' LDFLAGS=--coverage
san-cover: $(NODE_STAMP)
	$(COV_MAKE) check-build
	rm -rf $(CURDIR)/build/cov/gcda
	-IDEMKIT_TEST_GCOV=$(CURDIR)/build/cov/gcda IDEMKIT_TEST_SKIP='$(SAN_COVER_SKIP)' IDEMKIT_BATS_OPTS=--timing $(COV_MAKE) check
	sh tests/run.sh --list $(CHECK_RUNS) > build/cov/runs
	python3 tests/sancover.py collect build/cov/gcda build/cov/runs $(SAN_COVER)

# Adds runs to tests/san-cover.txt without renewing it (sancover.py add):
# SAN_ADD's runs (as CHECK_RUNS names them) on the --coverage build, their
# lines in the C sources the list has not seen noted as theirs.  For a
# change that brings new sources and the runs that reach them (a queue
# adapter and its suites): minutes, where make san-cover is the whole
# suite again.  make san-cover still renews all of it.
san-cover-add: $(NODE_STAMP)
	$(if $(SAN_ADD),,@echo "san-cover-add: SAN_ADD='RUN ...' names the runs to add" >&2; exit 64)
	$(COV_MAKE) check-build
	rm -rf $(CURDIR)/build/cov/gcda-add
	-IDEMKIT_TEST_GCOV=$(CURDIR)/build/cov/gcda-add IDEMKIT_BATS_OPTS=--timing $(COV_MAKE) check CHECK_RUNS="$(SAN_ADD)"
	python3 tests/sancover.py add build/cov/gcda-add $(SAN_COVER)

# End-to-end throughput, CPU per charge, latency and duplicates on this
# machine, as ratios against its own limits measured in the same run
# (bench/bench.py; BENCH_ONLY=a,b, BENCH_QUICK=1 for a run of a few
# minutes, BENCH_N etc. there).  Not part of `make test`.
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
	$(MAKE) $(SUBJOBS) O=build/fuzz CC=clang CFLAGS='$(FUZZ_FLAGS)' build/fuzz/lib/libidemkit.a
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

# The fault suites (tests/faults/): duplicate storm on the embedded
# default, dynalite, DynamoDB Local and RabbitMQ, kill -9 at every step
# boundary (on the embedded default, on DynamoDB Local + SQS and on a
# RabbitMQ queue: IDEMKIT_TEST_QUEUE_BACKEND=amqp), outages, AWS
# throttling and server errors, poison, a debit abandoned in a network
# partition (linger.bats: namespaces, so root; skipped otherwise).
# Minutes, not seconds; the measured numbers land in
# $(O)/faults-report.txt.  Two files at a time (FAULTS_JOBS; three took
# CI's step from 836 s to 736-755 s beside the model, but there the
# dynalite storm dead-lettered ~2 600 of its copies with DUP_IN_PROGRESS
# on their 10th delivery: that slow, a 12 s lease is shorter than a
# claimed charge's wait in its pipeline, so not by default), the runs
# that wait longest named first (a fresh clone has no times to order
# them by), and two tests at a time in a file whose tests each start
# their own servers and mostly wait (throttle, outage, crash, sigterm:
# leases and backoffs); one at a time where a test's storm keeps 8
# workers busy or the file's tests share a server they restart (storm,
# redis, postgres say so: BATS_NO_PARALLELIZE_WITHIN_FILE).
FAULTS_REPORT := $(CURDIR)/$(O)/faults-report.txt
FAULTS_JOBS ?= 2
faults: all $(NODE_STAMP)
	@mkdir -p $(O); rm -f $(FAULTS_REPORT)
	$(TEST_ENV) IDEMKIT_FAULTS_REPORT=$(FAULTS_REPORT) BATS_TEST_TIMEOUT=1200 \
	  IDEMKIT_TEST_JOBS=$(FAULTS_JOBS) IDEMKIT_TEST_FILE_JOBS=2 sh tests/run.sh \
	  tests/faults/throttle.bats tests/faults/worker-kill.bats tests/faults/outage.bats \
	  tests/faults/ \
	  'IDEMKIT_TEST_BACKEND=dynamodb-local tests/faults/crash.bats' \
	  'IDEMKIT_TEST_QUEUE_BACKEND=amqp tests/faults/crash.bats' \
	  'IDEMKIT_TEST_QUEUE_BACKEND=amqp tests/faults/storm.bats' \
	  'IDEMKIT_TEST_BACKEND=redis tests/faults/outbox.bats' \
	  'IDEMKIT_TEST_BACKEND=dynamodb tests/faults/outbox.bats' \
	  'IDEMKIT_TEST_BACKEND=postgres tests/faults/outbox.bats'
	@cat $(FAULTS_REPORT)

# The fault campaign (tests/chaos/, docs/RELIABILITY.md): workers, store,
# queue and bank on separate hosts (network namespaces; needs root, else
# it says so and exits 77), a generated workload, a nemesis drawing faults
# from SEED, and a checker judging the history against the invariants.
# BACKEND: embedded postgres redis dynamodb rabbitmq (default: each in turn);
# DURATION: seconds of faults per backend; SEED (default random, printed).
# `make chaos DEFECTS=1` runs tests/chaos/defects.sh instead: the seeded
# defects the campaign must find.  WORKER='CMD' judges another consumer in
# place of charge-worker (sh -c CMD on each worker host; the backends with
# an SQS queue only, embedded and rabbitmq are skipped): make chaos BACKEND=dynamodb
# WORKER='python3 examples/naive-consumer.py'.
BACKEND  ?= embedded postgres redis dynamodb rabbitmq
DURATION ?= 120
SEED     ?=
WORKER   ?=
chaos: all $(NODE_STAMP)
	@sh mk/deps.sh $(DEBS_CHAOS)
	@if [ -n '$(DEFECTS)' ]; then sh tests/chaos/defects.sh; exit $$?; fi; \
	rc=0; for b in $(if $(WORKER),$(filter-out embedded rabbitmq,$(BACKEND)),$(BACKEND)); do \
	  rm -rf $(CURDIR)/$(O)/chaos/$$b; \
	  python3 tests/chaos/chaos.py --backend $$b --duration $(DURATION) $(if $(SEED),--seed $(SEED)) \
	    $(if $(WORKER),--worker '$(WORKER)') \
	    --bin $(CURDIR)/$(O)/bin --out $(CURDIR)/$(O)/chaos/$$b; r=$$?; \
	  [ $$r -eq 77 ] && exit 77; [ $$r -eq 0 ] || rc=1; \
	done; exit $$rc

# The campaign's short fixed-seed run for CI: the embedded default and
# DynamoDB Local + SQS (the backend whose stuck charges the campaign found),
# CHAOS_CI_DURATION seconds of faults each on fixed seeds, under 5 minutes
# of wall time on the 2-core machine (docs/RELIABILITY.md has the figure).
# 77 (skip) without root; 1 on any violation.
CHAOS_CI ?= embedded:1 dynamodb:1
CHAOS_CI_DURATION ?= 40
chaos-ci: all $(NODE_STAMP)
	@sh mk/deps.sh $(DEBS_CHAOS)
	@rc=0; for bs in $(CHAOS_CI); do b=$${bs%%:*}; s=$${bs#*:}; \
	  rm -rf $(CURDIR)/$(O)/chaos-ci/$$b; \
	  python3 tests/chaos/chaos.py --backend $$b --seed $$s --duration $(CHAOS_CI_DURATION) \
	    --bin $(CURDIR)/$(O)/bin --out $(CURDIR)/$(O)/chaos-ci/$$b; r=$$?; \
	  [ $$r -eq 77 ] && exit 77; [ $$r -eq 0 ] || rc=1; \
	done; exit $$rc

# The campaign run long (tests/chaos/soak.sh): on each BACKEND in turn,
# run after run of SOAK_DURATION seconds of the full fault mix at SOAK_RATE
# charges a second, a fresh seed each, until SOAK_CHARGES charges were
# judged there; each run's row appended to SOAK_TABLE (docs/soak.md) as it
# ends.  Hours: run it in the background under nice.
SOAK_CHARGES  ?= 200000
SOAK_DURATION ?= 600
SOAK_RATE     ?= 4
SOAK_TABLE    ?= $(CURDIR)/docs/soak.md
soak: all $(NODE_STAMP)
	@sh mk/deps.sh $(DEBS_CHAOS)
	@rc=0; for b in $(BACKEND); do \
	  SOAK_CHARGES=$(SOAK_CHARGES) SOAK_DURATION=$(SOAK_DURATION) SOAK_RATE=$(SOAK_RATE) \
	    SOAK_TABLE=$(SOAK_TABLE) SOAK_DIR=$(CURDIR)/$(O)/soak sh tests/chaos/soak.sh $$b; r=$$?; \
	  [ $$r -eq 77 ] && exit 77; [ $$r -eq 0 ] || rc=$$r; \
	done; exit $$rc

# Seeded money defects (tests/mutants/NAME.patch), each applied to a scratch
# copy, built, and run against the suites it names: every one must be caught
# (N killed, 0 survived); a patch that no longer applies fails the run.
mutants: check-build $(NODE_STAMP)
	sh tests/mutants/run.sh $(MUTANTS)

# The protocol model-checked (tests/model/): spin on every configuration,
# exhaustive for the small bounds; the protocol must hold and every broken
# variant must be caught.  Needs spin and a C compiler, not the build.
# make test runs the quick bounds (tests/model.bats).
model:
	sh tests/model/run.sh full

# memcheck on a sample run of every C command (tests/valgrind.sh).
valgrind: all $(NODE_STAMP)
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin IDEMKIT_SRC=$(CURDIR) sh tests/valgrind.sh

demo-embedded: all
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin sh examples/demo.sh

demo-aws: all $(NODE_STAMP)
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin DEMO_BACKEND=aws sh examples/demo.sh

demo-postgres: all
	IDEMKIT_BIN=$(CURDIR)/$(O)/bin DEMO_BACKEND=postgres sh examples/demo.sh

# What `make install` ships besides the commands and pages: the systemd
# units of the worker and the cron-mode drain (not enabled), and the
# examples (crontabs, the env file, alert rules, the other units) under
# DOCDIR; the env file also as SYSCONFDIR/idemkit/idemkit.env unless one is
# there (it is the operator's).  The demo and its simulator's files stay
# out: bank-sim is not installed; so does naive-consumer.py, the campaign's
# example of a consumer that debits twice (docs/RELIABILITY.md), not one to
# deploy.  The examples name /usr/local/bin (the
# default PREFIX) and /etc/idemkit; installed, they name where they went.
SD_UNITS := examples/idemkit-worker.service examples/idemkit-drain.service examples/idemkit-drain.timer \
	examples/idemkit-outbox.service examples/idemp-run@.service examples/idemp-run@.timer
EXAMPLES := $(sort $(shell find examples -type f ! -name demo.sh ! -name bank-sim.env ! -name demo-client-secret \
              ! -name naive-consumer.py))
INSTALL_SUBST = sed -e 's|/usr/local/bin|$(BINDIR)|g' -e 's|/etc/idemkit|$(SYSCONFDIR)/idemkit|g'

install: product
	$(if $(filter 1,$(SHARED)),@echo "install: SHARED=1 is the mutants' scratch build; install a build without it" >&2; exit 64)
	mkdir -p $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man7 \
	  $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/idemkit
	for b in $(CMDS) $(SCRIPTS); do install -m 755 $(O)/bin/$$b $(DESTDIR)$(BINDIR)/$$b; done
	for m in $(PROD_MANS); do s=$${m##*.}; install -m 644 $$m $(DESTDIR)$(MANDIR)/man$$s/; done
	for f in $(SD_UNITS); do $(INSTALL_SUBST) $$f > $(DESTDIR)$(UNITDIR)/$${f##*/}; chmod 644 $(DESTDIR)$(UNITDIR)/$${f##*/}; done
	for f in $(EXAMPLES); do d=$(DESTDIR)$(DOCDIR)/$${f%/*}; mkdir -p $$d; \
	  $(INSTALL_SUBST) $$f > $$d/$${f##*/}; chmod 644 $$d/$${f##*/}; done
	[ -e $(DESTDIR)$(SYSCONFDIR)/idemkit/idemkit.env ] || \
	  install -m 644 $(DESTDIR)$(DOCDIR)/examples/idemkit.env $(DESTDIR)$(SYSCONFDIR)/idemkit/idemkit.env

# The Debian package (debian/): built by dpkg-buildpackage in a copy of the
# tree under $(O)/deb, so its clean step never touches this build, then
# checked by lintian (no errors).  The .deb lands in $(O)/deb.  Built on
# every core and without the -dbgsym package (what CI checks is the
# package's install, not its debug symbols); DEB_BUILD_OPTIONS adds to that.
DEB_DIR = $(abspath $(O))/deb
deb:
	@sh mk/deps.sh $(DEBS_BUILD) $(DEBS_DEB)
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/idemkit-$(VERSION)
	tar -cf - --exclude=./.git --exclude=./build --exclude=./node_modules --exclude=./$(O) . \
	  | tar -xf - -C $(DEB_DIR)/idemkit-$(VERSION)
	cd $(DEB_DIR)/idemkit-$(VERSION) && \
	  DEB_BUILD_OPTIONS="parallel=$$(nproc) noautodbgsym $${DEB_BUILD_OPTIONS:-}" \
	  dpkg-buildpackage -b -us -uc > ../build.log 2>&1 \
	  || { tail -40 ../build.log; exit 1; }
	lintian --fail-on error $(DEB_DIR)/idemkit_$(VERSION)_*.deb
	@ls $(DEB_DIR)/*.deb

# The package installed on a clean Debian 12 root (debootstrap, kept in
# $(O)/deb-root and copied per run) and the demo run there as the idemkit
# user (tests/deb-install.sh; root), apt's downloads kept beside the root
# for the next run.  Measured 2026-12-02 on 2 cores: 118 s with the root to
# make (CI's case), 51 s with the root and downloads kept.
deb-check: sim
	@$(MAKE) --no-print-directory deb
	IDEMKIT_DEB_ROOT=$(abspath $(O))/deb-root/bookworm sh tests/deb-install.sh \
	  $(DEB_DIR)/idemkit_$(VERSION)_$$(dpkg --print-architecture).deb $(O)/bin/bank-sim

# The env file stays: it is the operator's configuration.
uninstall:
	for b in $(CMDS) $(SCRIPTS); do rm -f $(DESTDIR)$(BINDIR)/$$b; done
	for m in $(PROD_MANS); do s=$${m##*.}; rm -f $(DESTDIR)$(MANDIR)/man$$s/$${m##*/}; done
	for f in $(SD_UNITS); do rm -f $(DESTDIR)$(UNITDIR)/$${f##*/}; done
	rm -rf $(DESTDIR)$(DOCDIR)

# Installs the build and test dependencies on Debian (run as root).
deps:
	sh mk/deps.sh $(DEBS_BUILD) $(DEBS_SIM) $(DEBS_TEST)

clean:
	rm -rf build

help:
	@echo 'targets: all product sim test check san-cover demo demo-embedded demo-postgres model mutants chaos chaos-ci soak sanitize faults fuzz fuzz-short valgrind bench demo-aws install uninstall deb deb-check deps clean'

.PHONY: all product sim test check check-runs check-build san-cover model mutants chaos chaos-ci soak demo-embedded demo-postgres sanitize faults fuzz fuzz-short valgrind bench demo demo-aws install uninstall deb deb-check deps clean help

# ---- bank-sim, the test double (sim/) ------------------------------------
# The core-banking and notification simulator the tests, the demo and the
# bench talk to.  It links the product library (for the event parser, logs
# and options) plus libmicrohttpd; the product never links it back.  It is
# built into $(O)/bin beside the commands so the suites find it on PATH, and
# `make install` leaves it out (with its man page).
SIM_SRC   := $(wildcard sim/*.c)
SIM_OBJ   := $(patsubst sim/%.c,$(O)/obj/sim/%.o,$(SIM_SRC))
SIM_PKGS  := $(foreach d,$(SIM_DEPS),$(word 1,$(subst :, ,$(d))))
SIM_MANS  := man/bank-sim.1
PROD_MANS := $(filter-out $(SIM_MANS),$(MANS))
ifeq ($(filter $(NODEPS_GOALS),$(MAKECMDGOALS)),)
SIM_MISSING := $(foreach d,$(SIM_DEPS),$(if $(shell $(PKG_CONFIG) --exists $(word 1,$(subst :, ,$(d))) 2>/dev/null && echo y),,$(word 2,$(subst :, ,$(d)))))
SIM_CFLAGS  := $(if $(strip $(SIM_MISSING)),,$(shell $(PKG_CONFIG) --cflags $(SIM_PKGS)))
SIM_LIBS    := $(if $(strip $(SIM_MISSING)),,$(shell $(PKG_CONFIG) --libs $(SIM_PKGS)))
endif

sim: $(O)/bin/bank-sim

$(O)/obj/sim/%.o: sim/%.c
	@mkdir -p $(@D)
	@if [ -n '$(strip $(SIM_MISSING))' ]; then echo 'bank-sim needs: apt-get install $(SIM_MISSING)   (or, as root: make deps)' >&2; exit 1; fi
	$(CC) $(IK_CFLAGS) -Isim $(SIM_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(O)/bin/bank-sim: $(SIM_OBJ) $(LIB_DEP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(IK_LDFLAGS) $(LDFLAGS) -o $@ $(SIM_OBJ) $(LIB_LINK) $(SIM_LIBS) $(LDLIBS) -lpthread

-include $(LIB_OBJ:.o=.d) $(patsubst cmd/%.c,$(O)/obj/cmd/%.d,$(CMD_SRC)) $(patsubst $(O)/test/%,$(O)/obj/tests/unit/%.d,$(UNITS)) \
         $(wildcard $(O)/obj/tests/fuzz/*.d) $(SIM_OBJ:.o=.d)
