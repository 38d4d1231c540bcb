# tests/rabbit_helper.bash: a throwaway RabbitMQ broker for the suites that
# need one (`load rabbit_helper`, after helper).  Erlang's start costs some
# 5 CPU seconds: start ONE per bats file, in setup_file (rabbit_start), and
# give each test its own queues.
#
# rabbit_start: a node of its own (RABBITMQ_NODENAME ikN@localhost), its
# AMQP listener on a free loopback port, its Erlang distribution port and
# its own epmd on free ports (ERL_EPMD_PORT: never the machine's 4369), its
# data, logs, cookie (HOME) and configuration under $BATS_FILE_TMPDIR/rabbit;
# no plugins; schedulers that do not spin when idle (the machine is
# shared).  Sets and exports RABBIT_PORT, and IDEMKIT_AMQP_PASSWORD for
# the guest user (allowed from loopback only).  rabbit_stop ends the broker
# and its epmd, by pid.  rabbit_restart stops the broker and starts it
# again on the same port and data (what is durable survives).
# rabbit_kill9: the broker killed hard (the node's beam process).
# rabbit_ctl ARGS...: rabbitmqctl against it (an Erlang start: ~1 CPU s).
# With RABBIT_TLS=DIR (rabbit_tls_certs DIR first), rabbit_start adds a TLS
# listener on RABBIT_TLS_PORT (exported) with DIR's server certificate.

require_rabbit() {
	if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
		[ "${CI:-}" = true ] && { echo "rabbitmq-server is required under CI" >&2; return 1; }
		skip "rabbitmq-server not installed (Debian: rabbitmq-server)"
	fi
}

_rabbit_env() {
	local d=$RABBIT_DIR
	export HOME=$d RABBITMQ_NODENAME=$RABBIT_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT=$RABBIT_PORT RABBITMQ_DIST_PORT=$RABBIT_DIST_PORT \
		ERL_EPMD_PORT=$RABBIT_EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
		RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log \
		RABBITMQ_ENABLED_PLUGINS_FILE=$d/plugins RABBITMQ_CONFIG_FILE=$d/rabbitmq \
		RABBITMQ_LOGS=$d/log/node.log RABBITMQ_ENABLED_PLUGINS= \
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
}

# _rabbit_launch: the broker on the ports chosen; 0 once it listens.
_rabbit_launch() {
	local i
	(
		_rabbit_env
		exec /usr/lib/rabbitmq/bin/rabbitmq-server
	) </dev/null >"$RABBIT_DIR/out.log" 2>&1 3>&- &
	echo $! > "$RABBIT_DIR/pid"
	for i in $(seq 1 600); do
		if (exec 2>/dev/null; echo > "/dev/tcp/127.0.0.1/$RABBIT_PORT"); then
			return 0
		fi
		kill -0 "$(cat "$RABBIT_DIR/pid")" 2>/dev/null || break
		sleep 0.05
	done
	tail -20 "$RABBIT_DIR/out.log" >&2
	return 1
}

rabbit_start() {
	local try
	export RABBIT_DIR=$BATS_FILE_TMPDIR/rabbit
	mkdir -p "$RABBIT_DIR"
	echo '[].' > "$RABBIT_DIR/plugins"
	for try in 1 2 3; do
		RABBIT_PORT=$(free_port) RABBIT_DIST_PORT=$(free_port)
		RABBIT_EPMD_PORT=$(free_port)
		export RABBIT_NODE=ik$$x$try@localhost RABBIT_PORT RABBIT_DIST_PORT RABBIT_EPMD_PORT
		cat > "$RABBIT_DIR/rabbitmq.conf" <<-CONF
		listeners.tcp.1 = 127.0.0.1:$RABBIT_PORT
		loopback_users.guest = true
		log.console = false
		CONF
		if [ -n "${RABBIT_TLS:-}" ]; then
			RABBIT_TLS_PORT=$(free_port)
			export RABBIT_TLS_PORT
			cat >> "$RABBIT_DIR/rabbitmq.conf" <<-CONF
			listeners.ssl.1 = 127.0.0.1:$RABBIT_TLS_PORT
			ssl_options.cacertfile = $RABBIT_TLS/ca.pem
			ssl_options.certfile = $RABBIT_TLS/server.pem
			ssl_options.keyfile = $RABBIT_TLS/server.key
			ssl_options.verify = verify_none
			ssl_options.fail_if_no_peer_cert = false
			CONF
		fi
		# our own epmd, in the foreground (stopped by its pid); erl finds it
		# on ERL_EPMD_PORT instead of starting a daemon of its own
		/usr/lib/erlang/erts-*/bin/epmd -port "$RABBIT_EPMD_PORT" -address 127.0.0.1 \
			</dev/null >/dev/null 2>&1 3>&- &
		echo $! > "$RABBIT_DIR/epmd.pid"
		if _rabbit_launch; then
			export IDEMKIT_AMQP_PASSWORD=guest
			return 0
		fi
		rabbit_stop
	done
	echo "rabbitmq-server did not start" >&2
	return 1
}

# the node's beam process: the start script's child
_rabbit_beam() {
	local pid
	pid=$(cat "$RABBIT_DIR/pid" 2>/dev/null) || return 0
	# none once the script followed a killed node: not a failure
	cat "/proc/$pid/task/$pid/children" 2>/dev/null || true
}

# _rabbit_down: the start script and its node, gone within 30 s.
_rabbit_down() {
	local pid i beam
	pid=$(cat "$RABBIT_DIR/pid" 2>/dev/null) || return 0
	beam=$(_rabbit_beam)
	kill "$pid" 2>/dev/null || true
	for i in $(seq 1 300); do
		kill -0 "$pid" 2>/dev/null || { [ -n "$beam" ] && kill -0 $beam 2>/dev/null; } || break
		sleep 0.1
	done
	[ -z "$beam" ] || kill -9 $beam 2>/dev/null || true
	rm -f "$RABBIT_DIR/pid"
}

rabbit_stop() {
	[ -n "${RABBIT_DIR:-}" ] || return 0
	_rabbit_down
	if [ -s "$RABBIT_DIR/epmd.pid" ]; then
		kill "$(cat "$RABBIT_DIR/epmd.pid")" 2>/dev/null || true
		rm -f "$RABBIT_DIR/epmd.pid"
	fi
}

rabbit_ctl() {
	(
		_rabbit_env
		exec /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RABBIT_NODE" "$@"
	) </dev/null 3>&-
}

rabbit_restart() {
	_rabbit_down
	_rabbit_launch
}

rabbit_kill9() {
	local beam
	beam=$(_rabbit_beam)
	[ -n "$beam" ] && kill -9 $beam
	# the start script follows its node
	_rabbit_down
}

# rabbit_tls_certs DIR: a throwaway CA (DIR/ca.pem) and the broker's
# certificate signed by it for localhost only (DIR/server.pem,
# server.key), and a second CA that signed nothing (DIR/other-ca.pem).
# P-256 keys: a few ms each.
rabbit_tls_certs() {
	local d=$1 ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
	mkdir -p "$d"
	openssl req -x509 "${ec[@]}" -keyout "$d/ca.key" -out "$d/ca.pem" -days 2 \
		-subj /CN=idemkit-test-ca 2>/dev/null &&
	openssl req -x509 "${ec[@]}" -keyout "$d/other-ca.key" -out "$d/other-ca.pem" -days 2 \
		-subj /CN=idemkit-test-ca 2>/dev/null &&
	openssl req "${ec[@]}" -keyout "$d/server.key" -out "$d/server.csr" \
		-subj /CN=localhost 2>/dev/null &&
	printf 'subjectAltName=DNS:localhost\n' > "$d/server.ext" &&
	openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" \
		-CAcreateserial -days 2 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
}

# rabbit_url NAME [PARAMS]: the URL of queue NAME on the broker.
rabbit_url() {
	echo "amqp://guest@127.0.0.1:$RABBIT_PORT#$1${2:+?$2}"
}
