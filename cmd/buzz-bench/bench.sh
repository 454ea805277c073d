#!/usr/bin/env bash
# Runs buzz-bench against a throwaway dev relay, then the Go benchmarks; run
# by `make bench` from the repository root after building bin/buzz-relay and
# bin/buzz-bench. Arguments are passed on to buzz-bench.
#
# The relay runs from bin/bench-data, so its private PostgreSQL lives in
# bin/bench-data/.data/postgres: two servers cannot share the `make run`
# cluster in .data/postgres.
set -euo pipefail

addr=127.0.0.1:3300
url=ws://localhost:3300
data=bin/bench-data
relay_log=bin/bench-relay.log
report=bin/bench.json
GO=${GO:-go}

mkdir -p "$data"
(
	cd "$data"
	export BUZZ_LISTEN_ADDR=$addr BUZZ_RELAY_URL=$url BUZZ_DEV_PG_PORT=54339
	# A load generator is one address and a few keys publishing flat out:
	# lift the per-client bounds it would otherwise measure instead.
	export BUZZ_METRICS_ADDR=127.0.0.1:3301 BUZZ_MAX_CONNECTIONS_PER_ADDRESS=100000 \
		BUZZ_PUBLISH_PER_MINUTE=100000000 BUZZ_PUBLISH_BURST=1000000
	exec ../buzz-relay dev
) >"$relay_log" 2>&1 &
relay=$!

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
for _ in $(seq 240); do # up to 2 minutes: the first run creates the cluster
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

# About 30 s of load: publish for 20 s, then req and fanout.
status=0
bin/buzz-bench -url "$url" -scenario all -duration 20s "$@" >"$report" || status=$?
cat "$report"
stop_relay

# Go micro-benchmarks, after the relay is gone so they have the CPU.
packages=()
for dir in internal/nostr internal/fanout; do
	if grep -qs '^func Benchmark' "$dir"/*_test.go; then
		packages+=("./$dir/")
	fi
done
if ((${#packages[@]} > 0)); then
	"$GO" test -run '^$' -bench . -benchtime 2s "${packages[@]}"
else
	echo "bench: no Go benchmarks in internal/nostr or internal/fanout" >&2
fi
exit "$status"
