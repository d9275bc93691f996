#!/usr/bin/env bash
# Cost of active health checks (`probe`, issue 21): 1,000 servers probed every second.
#   A  upstream `big` (1,000 servers: 127.0.0.1-250 x 4 ports of a backend nginx) without `probe`;
#   B  the same with `probe uri=/healthz interval=1s timeout=500ms` (1,000 probes per second).
# The front nginx: master + 2 workers with the module. Per round, A then B: IDLE seconds without
# traffic (the workers' CPU-seconds: in B that is the probing itself), then wrk (DURATION seconds,
# CONNS keep-alive client connections, new upstream connection per request) for proxied p99 and
# requests per worker CPU-second. Reports per-round values and the medians of B/A ratios.
#
#   module/t/bench/probe-cost.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), ROUNDS (default 3), IDLE (default 10),
# DURATION (default 10), CONNS (default 16).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="$(readlink -f "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
ROUNDS="${ROUNDS:-3}"; IDLE="${IDLE:-10}"; DURATION="${DURATION:-10}"; CONNS="${CONNS:-16}"
[ -f "$SO" ] || { echo "probe-cost: module not found at $SO" >&2; exit 1; }
for t in wrk curl python3; do command -v "$t" >/dev/null || { echo "probe-cost: $t not found" >&2; exit 1; }; done

DIR="$(mktemp -d)"
PID=""; BPID=""
stop_nginx() { [ -n "$PID" ] && { kill -QUIT "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; }; PID=""; }
cleanup() { stop_nginx; [ -n "$BPID" ] && { kill -QUIT "$BPID" 2>/dev/null; wait "$BPID" 2>/dev/null || true; }; rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR/logs" "$DIR/tmp" "$DIR/b/logs"
free_port() {
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); PB=($(free_port) $(free_port) $(free_port) $(free_port))

cat > "$DIR/b/nginx.conf" <<CONF
daemon off; master_process on; worker_processes 1;
error_log $DIR/b/logs/error.log warn; pid $DIR/b/logs/nginx.pid;
events { worker_connections 8192; }
http { access_log off;
  client_body_temp_path $DIR/tmp/bb; proxy_temp_path $DIR/tmp/bp;
  fastcgi_temp_path $DIR/tmp/bf; uwsgi_temp_path $DIR/tmp/bu; scgi_temp_path $DIR/tmp/bs;
  server { listen ${PB[0]}; listen ${PB[1]}; listen ${PB[2]}; listen ${PB[3]}; keepalive_requests 100000;
    location / { return 200 "ok\n"; } }
}
CONF
"$NGINX" -p "$DIR/b" -e "$DIR/b/logs/error.log" -c "$DIR/b/nginx.conf" &
BPID=$!

servers=""
for i in $(seq 1 250); do for p in "${PB[@]}"; do servers="$servers server 127.0.0.$i:$p;"; done; done
conf() { # $1: the probe line (or nothing)
  cat <<CONF
load_module $SO;
daemon off; master_process on; worker_processes 2;
error_log $DIR/logs/error.log warn; pid $DIR/logs/nginx.pid;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
  upstream big { zone big 4m; $servers $1 }
  server { listen 127.0.0.1:$P0 reuseport;
    location / { proxy_pass http://big; }
    location /api/ { allow 127.0.0.1; deny all; upstreams_api; } }
}
CONF
}
conf "" > "$DIR/a.conf"
conf "probe uri=/healthz interval=1s timeout=500ms;" > "$DIR/b.conf"

start_nginx() {
  "$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$1" &
  PID=$!
  for _ in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$P0/" && return 0; sleep 0.05; done
  echo "probe-cost: nginx did not start" >&2; cat "$DIR/logs/error.log" >&2; exit 1
}
worker_ticks() {
  local t=0 p f
  for p in $(pgrep -P "$PID"); do
    f=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
    t=$((t + $(awk '{print $12 + $13}' <<<"$f")))
  done
  echo "$t"
}
# -> "idle_cpu_s rps p99_ms non2xx req_per_cpu_s"
measure() {
  local t0 t1 t2 out
  sleep 3
  t0=$(worker_ticks); sleep "$IDLE"; t1=$(worker_ticks)
  out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$P0/")
  t2=$(worker_ticks)
  python3 -c '
import re, sys
t = sys.stdin.read(); hz = float(sys.argv[4])
idle = (int(sys.argv[2]) - int(sys.argv[1])) / hz
busy = (int(sys.argv[3]) - int(sys.argv[2])) / hz
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
n = int(re.search(r"(\d+) requests in", t).group(1))
m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
non2xx = int(re.search(r"Non-2xx or 3xx responses: (\d+)", t).group(1)) if "Non-2xx" in t else 0
print(idle, rps, p99, non2xx, n / max(busy, 1e-9))' "$t0" "$t1" "$t2" "$(getconf CLK_TCK)" <<<"$out"
}
: > "$DIR/results"
for r in $(seq "$ROUNDS"); do
  start_nginx "$DIR/a.conf"; echo "A $(measure)" >> "$DIR/results"; stop_nginx
  start_nginx "$DIR/b.conf"; echo "B $(measure)" >> "$DIR/results"
  probes=$(curl -s "http://127.0.0.1:$P0/api/big" | python3 -c "import json,sys; p=json.load(sys.stdin)['probe']; print(p['rounds'], p['probes'], p['owner_pid'])")
  healthy=$(curl -s "http://127.0.0.1:$P0/api/big" | python3 -c "import json,sys; print(sum(s['health']=='healthy' for s in json.load(sys.stdin)['servers']))")
  echo "probe-cost: round $r: B rounds/probes/owner $probes, healthy servers $healthy" >&2
  stop_nginx
done
python3 - "$DIR/results" "$ROUNDS" "$IDLE" "$DURATION" "$CONNS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {k: [list(map(float, r[1:])) for r in rows if r[0] == k] for k in "AB"}
med = statistics.median
print(f"probe-cost: {sys.argv[2]} rounds; idle {sys.argv[3]} s, then wrk {sys.argv[4]} s with {sys.argv[5]} connections; 1,000 servers, 2 workers")
for k, name in (("A", "no probe"), ("B", "probe every 1 s (1,000 probes/s)")):
    for i, v in enumerate(by[k]):
        print(f"  {k} round {i+1} {name:34s} idle worker CPU-s {v[0]:6.2f}  req/s {v[1]:8.0f}  p99 {v[2]:7.2f} ms  req per worker CPU-s {v[4]:8.0f}  non-2xx {int(v[3])}")
pairs = list(zip(by["A"], by["B"]))
print(f"  median idle worker CPU-s: A {med([a[0] for a,_ in pairs]):.2f}, B {med([b[0] for _,b in pairs]):.2f} "
      f"(probing = {med([b[0] for _,b in pairs]) / float(sys.argv[3]) * 100:.1f}% of one core)")
print(f"  median ratios B/A: p99 {med([b[2]/a[2] for a,b in pairs]):.3f}, req/s {med([b[1]/a[1] for a,b in pairs]):.3f}, "
      f"req per worker CPU-s {med([b[4]/a[4] for a,b in pairs]):.3f}")
PY
