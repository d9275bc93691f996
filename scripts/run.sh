#!/usr/bin/env bash
# The README's first command: set up, build, and run the Tributary daemon on an embedded default:
#   - data (SQLite store, API token) in .tributary/ (git-ignored)
#   - a local nginx with its own prefix .tributary/nginx/ on loopback: a front server on
#     $TRIBUTARY_DEMO_PORT (default 18080) proxying to the upstream `demo`, and two backends
#     (18081, 18082) answering "backend one" / "backend two"
#   - the daemon's API on 127.0.0.1:$TRIBUTARY_API_PORT (default 9180)
#   - a demo binding `demo` on the `static` plugin pointing at the two backends
#   - live mode: the nginx module is loaded and its upstreams API listens on a unix socket,
#     so a change of the demo's servers is applied without a reload (same worker processes)
# Ctrl-C stops everything this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

FRONT_PORT="${TRIBUTARY_DEMO_PORT:-18080}"
B1_PORT=$((FRONT_PORT + 1))
B2_PORT=$((FRONT_PORT + 2))
API_PORT="${TRIBUTARY_API_PORT:-9180}"
DATA="$ROOT/.tributary"
PREFIX="$DATA/nginx"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$TARGET/debug/tributary"

scripts/setup.sh run
echo "== build (daemon and plugins)"
cargo build --workspace --bins
# Live mode: the module (release .so) and its upstreams API on a unix socket (docs/live-api.md).
echo "== build (nginx module, release)"
cargo build --release -p ngx-combined-upstreams
MODULE_SO="$TARGET/release/libngx_http_combined_upstreams_module.so"
LIVE_API_SOCK="$PREFIX/logs/upstreams-api.sock"
LIVE_FLAGS=(--apply live --live-api "unix:$LIVE_API_SOCK:/api/")

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$FRONT_PORT" "$B1_PORT" "$B2_PORT" "$API_PORT"; do
  if port_busy "$p"; then
    echo "run.sh: port $p on 127.0.0.1 is in use (is another run.sh running?);" \
      "choose others with TRIBUTARY_DEMO_PORT / TRIBUTARY_API_PORT" >&2
    exit 1
  fi
done

mkdir -p "$DATA" "$PREFIX/conf/upstreams" "$PREFIX/logs" "$PREFIX/tmp"
chmod 700 "$DATA"
USER_LINE=""
[ "$(id -u)" -eq 0 ] && USER_LINE="user root;"
cat >"$PREFIX/conf/nginx.conf" <<EOF
# Written by scripts/run.sh (the demo nginx); the daemon writes upstreams/<name>.conf.
$USER_LINE
load_module $MODULE_SO;
daemon off;
master_process on;
worker_processes 2;
pid $PREFIX/logs/nginx.pid;
error_log $PREFIX/logs/error.log notice;
events { worker_connections 256; }
http {
    access_log off;
    default_type text/plain;
    client_body_temp_path $PREFIX/tmp/client_body;
    proxy_temp_path $PREFIX/tmp/proxy;
    fastcgi_temp_path $PREFIX/tmp/fastcgi;
    uwsgi_temp_path $PREFIX/tmp/uwsgi;
    scgi_temp_path $PREFIX/tmp/scgi;

    # The line tributary shows for each binding (here: all of them at once).
    include upstreams/*.conf;

    # The module's live upstreams API, reachable only through this socket (the daemon's --live-api).
    server { listen unix:$LIVE_API_SOCK; location /api/ { upstreams_api write=on; } }

    server { listen 127.0.0.1:$B1_PORT; location / { return 200 "backend one\n"; } }
    server { listen 127.0.0.1:$B2_PORT; location / { return 200 "backend two\n"; } }
    server {
        listen 127.0.0.1:$FRONT_PORT;
        location / {
            # A variable defers the lookup of the upstream to request time, so nginx starts
            # before the daemon wrote upstreams/demo.conf.
            set \$up demo;
            proxy_pass http://\$up;
        }
    }
}
EOF
NGINX=(nginx -p "$PREFIX" -c "$PREFIX/conf/nginx.conf" -e stderr)

NGINX_PID=""
DAEMON_PID=""
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "== stopping"
  if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  if [ -n "$NGINX_PID" ] && kill -0 "$NGINX_PID" 2>/dev/null; then
    kill -QUIT "$NGINX_PID" 2>/dev/null || true
    wait "$NGINX_PID" 2>/dev/null || true
  fi
}
trap cleanup INT TERM EXIT

echo "== nginx (prefix $PREFIX)"
"${NGINX[@]}" -t -q
"${NGINX[@]}" 2>>"$PREFIX/logs/stderr.log" &
NGINX_PID=$!
# The daemon confirms reloads from nginx's pid file and asks the live API at start: wait until nginx
# has written its pid and listens (seconds on a loaded machine), or say why it did not start.
for _ in $(seq 1 300); do
  grep -qE '^[0-9]+$' "$PREFIX/logs/nginx.pid" 2>/dev/null && port_busy "$FRONT_PORT" && break
  kill -0 "$NGINX_PID" 2>/dev/null || {
    echo "run.sh: nginx exited; its errors: $PREFIX/logs/stderr.log" >&2
    exit 1
  }
  sleep 0.1
done

echo "== tributary serve"
"$BIN" serve \
  --listen "127.0.0.1:$API_PORT" \
  --data-dir "$DATA" \
  --plugins-dir "$ROOT/plugins" \
  --conf-dir "$PREFIX/conf" \
  --test-cmd "${NGINX[*]} -t" \
  --reload-cmd "${NGINX[*]} -s reload" \
  "${LIVE_FLAGS[@]}" &
DAEMON_PID=$!

for _ in $(seq 1 100); do
  port_busy "$API_PORT" && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { echo "run.sh: the daemon exited" >&2; exit 1; }
  sleep 0.1
done

CLI=("$BIN" binding --api "http://127.0.0.1:$API_PORT" --data-dir "$DATA")
API_FLAG=""
[ "$API_PORT" != 9180 ] && API_FLAG=" --api http://127.0.0.1:$API_PORT"
# (Re)create the demo binding for this run's backend ports.
"${CLI[@]}" add demo --replace --plugin static --provider static --service demo \
  --config "targets=127.0.0.1:$B1_PORT 127.0.0.1:$B2_PORT" --directive "keepalive 8;"

cat <<EOF

Tributary is running (Ctrl-C stops the daemon and nginx).
  API    http://127.0.0.1:$API_PORT   token: $DATA/token
  Web UI http://127.0.0.1:$API_PORT/  password: cat $DATA/ui-initial-password (created at first start;
         or set TRIBUTARY_UI_PASSWORD before starting)
  nginx  http://127.0.0.1:$FRONT_PORT  prefix: $PREFIX

Try:
  curl http://127.0.0.1:$FRONT_PORT/          # through the generated upstream (round robin)
  cat $PREFIX/conf/upstreams/demo.conf        # with a zone line: live mode
  ps -o pid=,cmd= --ppid \$(cat $PREFIX/logs/nginx.pid)    # the workers, before and after a change
  $BIN binding$API_FLAG --data-dir $DATA list
  $BIN binding$API_FLAG --data-dir $DATA show demo
  $BIN binding$API_FLAG --data-dir $DATA add demo --replace --plugin static --provider static \\
      --service demo --config "targets=127.0.0.1:$B2_PORT:5 127.0.0.1:$B1_PORT" --directive "keepalive 8;"
  curl -H "Authorization: Bearer \$(cat $DATA/token)" http://127.0.0.1:$API_PORT/api/v1/bindings

EOF
wait "$DAEMON_PID"
