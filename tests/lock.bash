# hold_write_lock DB SECONDS: another process holds SQLite's write lock, so
# our commands meet a busy store (TEMPFAIL).  Returns once the lock is held.
hold_write_lock() {
	local ready=$BATS_TEST_TMPDIR/lock.ready
	rm -f "$ready"
	python3 -c '
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))
c.execute("ROLLBACK")' "$1" "$ready" "$2" 3>&- &
	LOCK_PID=$!
	for _ in $(seq 1 100); do [ -e "$ready" ] && return 0; sleep 0.05; done
	return 1
}
