#!/usr/bin/env bash
# Loads 1,000,000 synthetic events into a throwaway dev relay and reports
# bytes per event (heap and each index) and the read shapes timed through
# the relay, right after the load and again after ANALYZE. Run by
# `make bench-scale` from the repository root after building bin/buzz-relay
# and bin/buzz-bench.
#
# The events are SYNTHETIC rows, loaded by one INSERT ... SELECT over
# generate_series (cmd/buzz-bench/scale-load.sql): ids, pubkeys and
# signatures are pseudo-random bytes, so signatures are NOT valid. Reads
# never verify what they return, so the timings are real. Kind 1/7 mix,
# about 200 bytes of content from a word list (a word in 90% of rows, words
# in 5% and 0.1%), one p and one t tag, 500 authors, one community.
#
# Settings (environment): BENCH_SCALE_EVENTS (default 1000000),
# BENCH_SCALE_ADDR (127.0.0.1:3600), BENCH_SCALE_METRICS_ADDR
# (127.0.0.1:3601), BENCH_SCALE_PG_PORT (54369), BENCH_SCALE_LOCK (a file to
# flock around every timed step on a shared machine; unset: none).
set -euo pipefail

events=${BENCH_SCALE_EVENTS:-1000000}
addr=${BENCH_SCALE_ADDR:-127.0.0.1:3600}
metrics=${BENCH_SCALE_METRICS_ADDR:-127.0.0.1:3601}
pg_port=${BENCH_SCALE_PG_PORT:-54369}
port=${addr##*:}
url=ws://localhost:$port
host=localhost:$port
data=bin/bench-scale-data
relay_log=bin/bench-scale-relay.log
out=bin/bench-scale
pg_url=postgres://postgres@127.0.0.1:$pg_port/buzz?sslmode=disable

locked() {
	if [[ -n ${BENCH_SCALE_LOCK:-} ]]; then
		flock "$BENCH_SCALE_LOCK" "$@"
	else
		"$@"
	fi
}

for taken in "$addr" "127.0.0.1:$pg_port"; do
	if (exec 3<>"/dev/tcp/${taken%:*}/${taken##*:}") 2>/dev/null; then
		echo "bench-scale: $taken is already in use; stop what listens there or set BENCH_SCALE_ADDR / BENCH_SCALE_PG_PORT" >&2
		exit 1
	fi
done

# A throwaway store: the previous run's cluster is removed first.
rm -rf "$data" "$out"
mkdir -p "$data" "$out"
(
	cd "$data"
	export BUZZ_LISTEN_ADDR=$addr BUZZ_RELAY_URL=$url BUZZ_DEV_PG_PORT=$pg_port BUZZ_METRICS_ADDR=$metrics \
		BUZZ_MAX_CONNECTIONS_PER_ADDRESS=100000 BUZZ_HANDSHAKES_PER_SECOND=100000 BUZZ_PUBLISH_PER_MINUTE=100000000 BUZZ_PUBLISH_BURST=1000000 BUZZ_MESSAGES_PER_SECOND=1000000
	exec ../buzz-relay dev
) >"$relay_log" 2>&1 &
relay=$!
stop_relay() {
	if kill -0 "$relay" 2>/dev/null; then
		kill -TERM "$relay"
		wait "$relay" || true
	fi
}
trap stop_relay EXIT
trap 'exit 130' INT TERM

echo "bench-scale: starting the relay on $addr (log: $relay_log)" >&2
healthy=false
for _ in $(seq 240); do
	if curl -fsS "http://$addr/health" >/dev/null 2>&1; then
		healthy=true
		break
	fi
	kill -0 "$relay" 2>/dev/null || break
	sleep 0.5
done
if ! $healthy; then
	echo "bench-scale: the relay did not become healthy; last lines of $relay_log:" >&2
	tail -n 20 "$relay_log" >&2
	exit 1
fi

psql_q() { psql "$pg_url" -X -q -v ON_ERROR_STOP=1 "$@"; }

echo "bench-scale: loading $events SYNTHETIC events by INSERT ... SELECT generate_series (signatures not valid; cmd/buzz-bench/scale-load.sql)" >&2
start=$(date +%s.%N)
locked psql "$pg_url" -X -q -v ON_ERROR_STOP=1 -v host="$host" -v n="$events" -f cmd/buzz-bench/scale-load.sql
load_s=$(echo "$(date +%s.%N) - $start" | bc)

# shapes STAGE: time every read shape through the relay with buzz-bench
# (common/rare and mid/absent search terms in two runs).
shapes() {
	local stage=$1
	locked bin/buzz-bench -url "$url" -scenario shapes -req-seed 0 -req-iterations 200 \
		-search-common lorem -search-rare rare42 >"$out/shapes-$stage.json" || true
	locked bin/buzz-bench -url "$url" -scenario shapes -req-seed 0 -req-iterations 200 -shapes search-common,search-rare \
		-search-common common7 -search-rare absentword >"$out/search-$stage.json" || true
}

sizes() {
	psql_q -f cmd/buzz-bench/scale-sizes.sql
}

analyzed() {
	psql_q -At -c "SELECT coalesce(greatest(last_analyze, last_autoanalyze)::text, 'never') FROM pg_stat_user_tables WHERE relname = 'events'"
}

echo "== right after the load ($load_s s; events analyzed: $(analyzed))"
sizes | tee "$out/sizes-after-load.txt"
# The relay analyzes a table that outgrew its statistics by itself within
# about a second (BUZZ_EVENTS_ANALYZE_INTERVAL_MS); say whether it has.
echo "(events analyzed when the timed shapes start: $(analyzed))"
shapes after-load

echo "bench-scale: VACUUM ANALYZE events (what autovacuum does on its own within a minute or so)" >&2
psql_q -c "VACUUM ANALYZE events"
echo "== after VACUUM ANALYZE (events analyzed: $(analyzed))"
sizes | tee "$out/sizes-analyzed.txt"
shapes analyzed

# One table: every shape's p50/p99 in both stages.
table() {
	local stage=$1 f
	for f in "$out/shapes-$stage.json" "$out/search-$stage.json"; do
		[[ -s $f ]] || continue
		jq -r --arg stage "$stage" '
			.scenarios.shapes.shapes[]?
			| [$stage, .name + (if .filter.search then "(" + .filter.search + ")" else "" end),
			   .latency.p50_ms, .latency.p99_ms, .latency.max_ms, .completed, (.skipped // "")]
			| @tsv' "$f" 2>/dev/null || true
	done
}
echo
echo "read shapes through the relay, REQ to EOSE ($events synthetic events), ms"
{
	printf 'stage\tshape\tp50\tp99\tmax\tREQs\tnote\n'
	table after-load
	table analyzed
} | column -t -s $'\t'
