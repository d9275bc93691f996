#!/usr/bin/env bash
# Cost of the live upstream API (issue 11) on the request path, measured in one run:
#   A  upstream `app` with a zone, no `upstreams_api` in the configuration (the module adds nothing);
#   B  the same with an `upstreams_api` location (every request of `app` goes through the gate and the
#      balancer wrappers);
#   C  B while the server set of `app` is replaced every 100 ms by a PUT (alternating two sets of 2 of
#      the 4 backends).
# nginx: master + 2 workers; load: wrk keep-alive, CONNS connections. Rounds run A, B, C in turn; the
# medians of the per-round ratios B/A and C/A are reported for requests/s and p99 latency, next to the
# absolute medians, and the requests served per CPU-second of the two workers (from /proc: the measure to
# read on a shared machine, where wrk's rates follow whatever else runs). Non-2xx answers and socket errors
# are counted (must be 0).
#
#   module/t/bench/live-overhead.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), ROUNDS (default 5), DURATION (wrk seconds, default 5),
# CONNS (default 32).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="$(readlink -f "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
ROUNDS="${ROUNDS:-5}"; DURATION="${DURATION:-5}"; CONNS="${CONNS:-32}"
[ -f "$SO" ] || { echo "live-overhead: module not found at $SO" >&2; exit 1; }
for t in wrk curl python3; do command -v "$t" >/dev/null || { echo "live-overhead: $t not found" >&2; exit 1; }; done

DIR="$(mktemp -d)"
PID=""; PUTTER=""
stop_nginx() {
  [ -n "$PID" ] && { kill -QUIT "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; }
  PID=""
}
cleanup() { [ -n "$PUTTER" ] && kill "$PUTTER" 2>/dev/null; stop_nginx; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR/logs" "$DIR/tmp"
free_port() {
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port); P4=$(free_port)

conf() { # $1: extra lines in the front server
  cat <<CONF
load_module $SO;
daemon off; master_process on; worker_processes 2;
error_log $DIR/logs/error.log warn; pid $DIR/logs/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
  upstream app { zone app 256k; server 127.0.0.1:$P1; server 127.0.0.1:$P2; keepalive 32; }
  server { listen 127.0.0.1:$P1; location / { return 200 "b1\n"; } }
  server { listen 127.0.0.1:$P2; location / { return 200 "b2\n"; } }
  server { listen 127.0.0.1:$P3; location / { return 200 "b3\n"; } }
  server { listen 127.0.0.1:$P4; location / { return 200 "b4\n"; } }
  server {
    listen 127.0.0.1:$P0 reuseport;
    location / { proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://app; }
    $1
  }
}
CONF
}
conf "" > "$DIR/a.conf"
conf "location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }" > "$DIR/b.conf"

start_nginx() {
  "$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$1" &
  PID=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$P0/" && return 0; sleep 0.05; done
  echo "live-overhead: nginx did not start" >&2; cat "$DIR/logs/error.log" >&2; exit 1
}
# CPU ticks (user + system) of the nginx workers so far
worker_ticks() {
  local t=0 p f
  for p in $(pgrep -P "$PID"); do
    f=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    t=$((t + $(awk '{print $12 + $13}' <<<"$f")))
  done
  echo "$t"
}
# wrk -> "req/s p99_ms non2xx socket_errors requests_per_worker_cpu_second"
measure() {
  local t0 t1 out
  t0=$(worker_ticks)
  out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$P0/")
  t1=$(worker_ticks)
  python3 -c '
import re, sys
t = sys.stdin.read()
ticks = (int(sys.argv[2]) - int(sys.argv[1])) / float(sys.argv[3])
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
n = int(re.search(r"(\d+) requests in", t).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
non2xx = int(re.search(r"Non-2xx or 3xx responses: (\d+)", t).group(1)) if "Non-2xx" in t else 0
se = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
errs = sum(int(x) for x in se.groups()) if se else 0
print(rps, p99, non2xx, errs, n / max(ticks, 1e-9))' "$t0" "$t1" "$(getconf CLK_TCK)" <<<"$out"
}
putter() {
  local a="{\"servers\":[{\"address\":\"127.0.0.1:$P1\"},{\"address\":\"127.0.0.1:$P2\"}]}"
  local b="{\"servers\":[{\"address\":\"127.0.0.1:$P3\"},{\"address\":\"127.0.0.1:$P4\"}]}"
  local n=0 code
  while :; do
    if [ $((n % 2)) = 0 ]; then body="$b"; else body="$a"; fi
    code=$(curl -s -o /dev/null -w "%{http_code}" -X PUT "http://127.0.0.1:$P0/api/app" -d "$body")
    [ "$code" = 200 ] || echo "live-overhead: PUT answered $code" >&2
    n=$((n + 1)); echo "$n" > "$DIR/puts"
    sleep 0.1
  done
}

: > "$DIR/results"
for r in $(seq "$ROUNDS"); do
  start_nginx "$DIR/a.conf"; echo "A $(measure)" >> "$DIR/results"; stop_nginx
  start_nginx "$DIR/b.conf"; echo "B $(measure)" >> "$DIR/results"
  putter & PUTTER=$!
  echo "C $(measure)" >> "$DIR/results"
  kill "$PUTTER"; wait "$PUTTER" 2>/dev/null || true; PUTTER=""
  stop_nginx
done
puts=$(cat "$DIR/puts" 2>/dev/null || echo 0)
python3 - "$DIR/results" "$ROUNDS" "$DURATION" "$CONNS" "$puts" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {k: [list(map(float, r[1:])) for r in rows if r[0] == k] for k in "ABC"}
med = lambda xs: statistics.median(xs)
print(f"live-overhead: {sys.argv[2]} rounds x {sys.argv[3]} s, {sys.argv[4]} keep-alive connections, 2 workers; "
      f"PUTs in the last C round: {sys.argv[5]}")
for k, name in (("A", "no upstreams_api"), ("B", "upstreams_api configured"), ("C", "upstreams_api + PUT every 100 ms")):
    v = by[k]
    print(f"  {k} {name:34s} req/s {med([x[0] for x in v]):9.0f}  p99 {med([x[1] for x in v]):7.2f} ms  "
          f"req per worker CPU-s {med([x[4] for x in v]):8.0f}  non-2xx {int(sum(x[2] for x in v))}  "
          f"socket errors {int(sum(x[3] for x in v))}")
for k in "BC":
    rps = med([b[0] / a[0] for a, b in zip(by["A"], by[k])])
    p99 = med([b[1] / a[1] for a, b in zip(by["A"], by[k])])
    cpu = med([b[4] / a[4] for a, b in zip(by["A"], by[k])])
    print(f"  ratio {k}/A: req/s {rps:.3f}, p99 {p99:.3f}, requests per worker CPU-second {cpu:.3f} "
          f"(medians of per-round ratios; on a shared machine read the CPU ratio)")
bad = sum(x[2] + x[3] for k in "ABC" for x in by[k])
sys.exit(1 if bad else 0)
PY
