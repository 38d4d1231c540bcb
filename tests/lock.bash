# hold_write_lock DB [--exclusive]: another process holds SQLite's write
# lock, so our commands meet a busy store (TEMPFAIL); --exclusive locks the
# file against readers too (a WAL reader never waits for a writer).
# Returns once the lock is held.
# The lock is held until the test kills $LOCK_PID, or until the test's own
# process is gone (a failed test's lock ends with it), never for a fixed
# time: on a busy machine a lock that ended by the clock ended before the
# commands that were meant to meet it (CI's failure of queue.bats 19).
# A ceiling of 600 s guards only against a test process that never ends.
hold_write_lock() {
	local ready=$BATS_TEST_TMPDIR/lock.ready
	rm -f "$ready"
	python3 -c '
import os, sqlite3, sys, time
parent = os.getppid()
c = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[3] == "--exclusive":
    c.execute("PRAGMA locking_mode=EXCLUSIVE"); c.execute("PRAGMA journal_mode=DELETE")
    c.execute("BEGIN EXCLUSIVE")
else:
    c.execute("BEGIN IMMEDIATE")
open(sys.argv[2], "w").close()
end = time.monotonic() + 600
while os.getppid() == parent and time.monotonic() < end:
    time.sleep(0.2)
c.execute("ROLLBACK")' "$1" "$ready" "${2:-}" 3>&- &
	LOCK_PID=$!
	local i
	for i in $(seq 1 600); do [ -e "$ready" ] && return 0; sleep 0.05; done
	echo "hold_write_lock: no lock on $1 after 30 s" >&2
	return 1
}
