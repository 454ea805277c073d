#!/usr/bin/env bash
# Runs every measure of `make bench` and prints one table (measure, result,
# target, pass/miss); run from the repository root after building
# bin/buzz-relay and bin/buzz-bench. Arguments are passed on to buzz-bench.
#
# In order, on one machine, about 6 minutes:
#   1. a throwaway dev relay on a FRESH private PostgreSQL (bin/bench-data is
#      wiped: the after-burst measure needs a table that never had rows);
#   2. pgbench single-row INSERTs on that same cluster, the reference rate;
#   3. buzz-bench: a burst, then REQ kinds in 5 s windows; the REQ shapes;
#      publish at 1, 16 and 64 publishers; fan-out to 1,000 subscribers with
#      the relay's resident memory; then mention -> operator listener through
#      the relay (OK to POST received; the relay routes buzz-bench's own
#      HTTPS listener, set up before it starts);
#   4. the table, built from bin/bench.json (kept for machines) and
#      bin/bench-pgbench.txt.
#
# Environment:
#   BENCH_LISTENER_IDLE  silence before the last mention (default 2m; 0s
#                        skips the wait, and the after-idle number means nothing)
#   BENCH_LISTENER=0     skip the listener measure (and the listener's set-up)
#   BENCH_MICRO=1        also run the Go micro-benchmarks of internal/nostr
#                        and internal/fanout (not in the table)
set -euo pipefail

addr=127.0.0.1:3300
url=ws://localhost:3300
pg_port=54339
data=bin/bench-data
relay_log=bin/bench-relay.log
report=bin/bench.json
pgbench_out=bin/bench-pgbench.txt
listener_dir=bin/bench-listener
listener_addr=127.0.0.1:3302

rm -rf "$data" "$report" "$pgbench_out" "$listener_dir"
mkdir -p "$data"
listener_flags=()
if [[ ${BENCH_LISTENER:-1} != 0 ]]; then
	# The relay routes buzz-bench's listener: its key, and a certificate the
	# relay trusts through SSL_CERT_FILE (Go's roots on Linux).
	listener_pubkey=$(bin/buzz-bench listener-setup "$listener_dir")
	export BUZZ_OPERATOR_LISTENERS="$listener_pubkey:https://$listener_addr/hook" \
		RELAY_OPERATOR_API_ORIGIN=http://${url#ws://} SSL_CERT_FILE=$PWD/$listener_dir/cert.pem
	listener_flags=(-listener-dir "$listener_dir" -listener-addr "$listener_addr" -listener-idle "${BENCH_LISTENER_IDLE:-2m}")
fi
(
	cd "$data"
	export BUZZ_LISTEN_ADDR=$addr BUZZ_RELAY_URL=$url BUZZ_DEV_PG_PORT=$pg_port
	# A load generator is one address and a few keys publishing flat out:
	# lift the per-client bounds it would otherwise measure instead.
	export BUZZ_METRICS_ADDR=127.0.0.1:3301 BUZZ_MAX_CONNECTIONS_PER_ADDRESS=100000 BUZZ_HANDSHAKES_PER_SECOND=100000 \
		BUZZ_PUBLISH_PER_MINUTE=100000000 BUZZ_PUBLISH_BURST=1000000 BUZZ_MESSAGES_PER_SECOND=1000000
	exec ../buzz-relay dev
) >"$relay_log" 2>&1 &
relay=$! # the subshell execs the relay: this is its process id

# SIGTERM makes the dev relay drain its connections and stop its PostgreSQL.
stop_relay() {
	if kill -0 "$relay" 2>/dev/null; then
		kill -TERM "$relay"
		wait "$relay" || true
	fi
}
trap stop_relay EXIT
trap 'exit 130' INT TERM

echo "bench: starting the relay on $addr (log: $relay_log)" >&2
healthy=false
for _ in $(seq 240); do # up to 2 minutes
	if curl -fsS "http://$addr/health" >/dev/null 2>&1; then
		healthy=true
		break
	fi
	if ! kill -0 "$relay" 2>/dev/null; then
		break
	fi
	sleep 0.5
done
if ! $healthy; then
	echo "bench: the relay did not become healthy; last lines of $relay_log:" >&2
	tail -n 20 "$relay_log" >&2
	exit 1
fi

# pgbench: 16 clients inserting one row per transaction into a one-column
# table, on the relay's own cluster, fsync and synchronous_commit as the
# relay has them.
pgbin=$(dirname "$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -n 1 || echo /nonexistent/pgbench)")
pg_url="postgres://postgres@127.0.0.1:$pg_port/buzz?sslmode=disable"
if [[ -x $pgbin/pgbench && -x $pgbin/psql ]]; then
	echo "bench: pgbench single-row INSERT, 16 clients, 10 s" >&2
	"$pgbin/psql" -X -q "$pg_url" -c "CREATE TABLE bench_pgbench_insert (x int)"
	script=$(mktemp)
	echo "INSERT INTO bench_pgbench_insert (x) VALUES (1);" >"$script"
	"$pgbin/pgbench" -n -c 16 -j 2 -T 10 -f "$script" "$pg_url" >"$pgbench_out" 2>&1 || cat "$pgbench_out" >&2
	rm -f "$script"
	"$pgbin/psql" -X -q "$pg_url" -c "DROP TABLE bench_pgbench_insert"
else
	echo "bench: no pgbench/psql found; the table has no reference rate" >&2
fi

status=0
bin/buzz-bench -url "$url" -scenario all -publishers 1,16,64 -duration 10s \
	-after-burst-for 60s -shape-budget 3s -relay-pid "$relay" -metrics-url http://127.0.0.1:3301/metrics \
	"${listener_flags[@]}" "$@" >"$report" || status=$?
stop_relay

if [[ ${BENCH_MICRO:-0} == 1 ]]; then
	"$GO" test -run '^$' -bench . -benchtime 2s ./internal/nostr/ ./internal/fanout/
fi

echo >&2
bin/buzz-bench table -pgbench "$pgbench_out" "$report" | tee bin/bench-table.txt
echo "bench: JSON report in $report, table in bin/bench-table.txt" >&2
exit "$status"
