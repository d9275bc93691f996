#!/usr/bin/env bash
# Proof of the Debian packages (scripts/package.sh builds them first): for each suite, in a FRESH copy of
# that suite's base chroot (scripts/lib/chroot.sh), with nginx and the daemon on free 127.0.0.1 ports:
#   1. `apt-get install ./module.deb ./tributary.deb` (apt pulls nginx); another suite's module is refused
#   2. the module is enabled (modules-enabled link) and `nginx -t` passes
#   3. a configuration using `upstrand` answers through nginx (first upstream dead, the second answers)
#   4. the daemon, started exactly as the unit's ExecStart line, applies a `static` binding and nginx
#      serves it; its web UI password file is 0600 and the password appears in no log
#   5. purge (then autoremove --purge of what apt pulled) leaves the tree as it was before the install
#   + `systemd-analyze verify` of the installed unit (once)
#
#   scripts/test-packages.sh [SUITE...]      default: bookworm trixie sid
#
# Needs root and the network (apt in the chroots; downloaded .debs are cached machine-wide).
# Prints one line per check and `N passed, N failed`; exits non-zero when a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=$PWD
# shellcheck source=lib/chroot.sh
. scripts/lib/chroot.sh
# shellcheck source=scripts/lib/count.sh
. scripts/lib/count.sh

SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie sid)
OUT="$ROOT_DIR/target/debian"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tributary-pkgtest.XXXXXX")
chmod 0755 "$WORK"
PIDS=()
ROOTS=()
cleanup() {
  local p r
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for r in "${ROOTS[@]}"; do
    [ -f "$r/run/nginx.pid" ] && kill -QUIT "$(cat "$r/run/nginx.pid")" 2>/dev/null
  done
  sleep 0.5
  for r in "${ROOTS[@]}"; do
    [ -f "$r/run/nginx.pid" ] && kill -KILL "$(cat "$r/run/nginx.pid")" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

check() { # NAME COMMAND...
  local name=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    count_pass "$name"
    echo "ok   $name"
  else
    count_fail "$name"
    echo "FAIL $name"
    sed 's/^/     | /' <<<"$out" | tail -n 25
  fi
  return $rc
}

free_port() { # a loopback port nothing accepts on, below the ephemeral range
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

suite_suffix() {
  case "$1" in bookworm) echo deb12 ;; trixie) echo deb13 ;; sid) echo sid ;; esac
}

# The file tree of ROOT (path, type, mode), without what apt, dpkg and logging change on any install, and
# /var/www, which nginx-common's own purge leaves (its default page), not ours.
snapshot() {
  (cd "$1" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./run -o -path ./tmp \
    -o -path ./var/tmp -o -path ./var/cache -o -path ./var/lib/apt -o -path ./var/lib/dpkg -o -path ./var/log \
    -o -path ./etc/ld.so.cache -o -path ./var/www \) -prune -o -printf '%p %y %m\n' | sort)
}

wait_http() { # URL EXPECTED-BODY-SUBSTRING [SECONDS]
  local i body
  for i in $(seq $((${3:-10} * 10))); do
    body=$(curl -s --max-time 2 "$1") && grep -q "$2" <<<"$body" && { echo "$body"; return 0; }
    sleep 0.1
  done
  echo "no answer containing '$2' from $1 (last: ${body:-none})"
  return 1
}

# systemd-analyze verify of the installed unit: in a scratch root with the host's systemd units and the
# installed /usr/bin/tributary (the chroot has no systemd). Warnings (unknown keys) fail it too.
verify_unit() { # ROOT UNIT
  local r="$WORK/verify-root" out
  rm -rf "$r"
  mkdir -p "$r/usr/lib/systemd" "$r/usr/bin" "$r/etc"
  cp -a /lib/systemd/system "$r/usr/lib/systemd/" || return 1
  ln -s usr/lib "$r/lib"
  cp "$2" "$r/usr/lib/systemd/system/tributary.service"
  cp "$1/usr/bin/tributary" "$r/usr/bin/tributary"
  out=$(systemd-analyze verify --root="$r" /usr/lib/systemd/system/tributary.service 2>&1) || { echo "$out"; return 1; }
  [ -z "$out" ] || { echo "$out"; return 1; }
}

# These run inside the loop: they use its root, X, API and B1.
apt_install() { # DEB...: the downloaded-package cache is machine-wide; wait while another run holds its lock
  local out i
  for i in 1 2 3 4 5 6; do
    out=$(X apt-get install -y -q --no-install-recommends "$@" 2>&1) && return 0
    grep -q "Could not get lock" <<<"$out" || break
    sleep 10
  done
  echo "$out"
  return 1
}
refused_for_abi() { # DEB: apt must refuse it, for its nginx-abi dependency
  local out
  out=$(X apt-get install -s -y --no-install-recommends "$1" 2>&1) && { echo "apt accepted it:"; echo "$out"; return 1; }
  grep -q "nginx-abi" <<<"$out" || { echo "refused, but not for nginx-abi:"; echo "$out"; return 1; }
}
add_binding() {
  X tributary binding add api --plugin static --provider static --service api \
    --config "targets=127.0.0.1:$B1" --api "http://127.0.0.1:$API" --data-dir /var/lib/tributary
}
remove_binding() {
  X tributary binding rm api --api "http://127.0.0.1:$API" --data-dir /var/lib/tributary || return 1
  for _ in $(seq 50); do
    [ -e "$root/etc/nginx/upstreams/api.conf" ] || return 0
    sleep 0.1
  done
  echo "$root/etc/nginx/upstreams/api.conf is still there"
  return 1
}

echo "== scripts/package.sh ${SUITES[*]}"
T0=$(date +%s)
if ! scripts/package.sh "${SUITES[@]}"; then
  count_fail "scripts/package.sh"
  count_summary "== packages: "
  exit 1
fi
echo "   packages built in $(($(date +%s) - T0)) s"
ls -l "$OUT"/*.deb | awk '{print "   " $5 " bytes  " $NF}'
TRIBUTARY_DEB=$(ls "$OUT"/tributary_*_amd64.deb)

verified_unit=false
for suite in "${SUITES[@]}"; do
  T_SUITE=$(date +%s)
  echo "== $suite"
  suffix=$(suite_suffix "$suite")
  module_deb=$(ls "$OUT"/libnginx-mod-http-combined-upstreams_*+"$suffix"_amd64.deb)
  root="$WORK/$suite/root"
  check "$suite: fresh chroot copy" chroot_copy "$suite" minbase "$root" || continue
  ROOTS+=("$root")
  archives=$(chroot_apt_archives "$suite")
  X() { chroot_exec "$root" --bind "$archives:/var/cache/apt/archives" --ro-bind "$OUT:/debs" -- "$@"; }
  # No init in a chroot: maintainer scripts must not try to start services (the usual policy-rc.d).
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  X apt-get "$(chroot_apt_update_opts "$suite")" update -qq >"$WORK/$suite-update.log" 2>&1
  before=$(snapshot "$root")

  T_INSTALL=$(date +%s)
  check "$suite: apt-get install ./$(basename "$module_deb") ./$(basename "$TRIBUTARY_DEB")" \
    apt_install "/debs/$(basename "$module_deb")" "/debs/$(basename "$TRIBUTARY_DEB")" || continue
  INSTALL_S=$(($(date +%s) - T_INSTALL))
  echo "   install took $INSTALL_S s"
  T_TEST=$(date +%s)

  for other in "$OUT"/libnginx-mod-http-combined-upstreams_*_amd64.deb; do
    [ "$other" = "$module_deb" ] && continue
    check "$suite: apt refuses $(basename "$other")" refused_for_abi "/debs/$(basename "$other")"
  done

  check "$suite: module enabled like Debian's modules" bash -c '
    l="$1/etc/nginx/modules-enabled/50-mod-http-combined-upstreams.conf"
    [ "$(readlink "$l")" = /usr/share/nginx/modules-available/mod-http-combined-upstreams.conf ] || { ls -l "$l"; exit 1; }
    grep -qx "load_module modules/ngx_http_combined_upstreams_module.so;" "$1/usr/share/nginx/modules-available/mod-http-combined-upstreams.conf"
    [ -f "$1/usr/lib/nginx/modules/ngx_http_combined_upstreams_module.so" ]' _ "$root"
  check "$suite: tributary installed: plugins point at installed binaries, state dir 0700, upstreams/ made" bash -c '
    set -e
    for m in "$1"/usr/lib/tributary/plugins/*/plugin.json; do
      exe=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[\"executable\"])" "$m")
      [ -x "$(dirname "$m")/$exe" ] || { echo "$m: executable $exe not installed"; exit 1; }
      case "$exe" in *run.sh) echo "$m still names $exe"; exit 1 ;; esac
    done
    [ "$(stat -c %a "$1/var/lib/tributary")" = 700 ] || { stat "$1/var/lib/tributary"; exit 1; }
    [ -d "$1/etc/nginx/upstreams" ]
    [ -f "$1/etc/tributary/tributary.toml" ]' _ "$root"

  # Free ports: the front server, two backends, the daemon's API; nothing on :80 (the default site).
  P0=$(free_port); B1=$(free_port); B2=$(free_port); DEAD=$(free_port); API=$(free_port)
  rm -f "$root/etc/nginx/sites-enabled/default"
  rm -f "$root/run/nginx.pid"
  check "$suite: nginx -t with the module enabled" X /usr/sbin/nginx -t
  # Why the unit keeps /run writable (docs/operations.md): the test alone creates nginx's pid file.
  check "$suite: nginx -t created /run/nginx.pid (nginx not running)" test -e "$root/run/nginx.pid"
  cat >"$root/etc/nginx/conf.d/tributary-test.conf" <<CONF
include /etc/nginx/upstreams/*.conf;
upstream dead { server 127.0.0.1:$DEAD; }
upstream live { server 127.0.0.1:$B2; }
upstrand pair { upstream dead; upstream live; order per_request; next_upstream_statuses error timeout 5xx; }
server { listen 127.0.0.1:$B1; return 200 "static binding backend\n"; }
server { listen 127.0.0.1:$B2; return 200 "upstrand second upstream\n"; }
server {
  listen 127.0.0.1:$P0;
  location /pair { proxy_pass http://\$upstrand_pair; }
  location /api  { set \$u api; proxy_pass http://\$u; }
}
CONF
  check "$suite: nginx -t with an upstrand configuration" X /usr/sbin/nginx -t
  check "$suite: nginx starts" X /usr/sbin/nginx
  check "$suite: upstrand answers through nginx" wait_http "http://127.0.0.1:$P0/pair" "upstrand second upstream"

  unit=$(ls "$root"/lib/systemd/system/tributary.service "$root"/usr/lib/systemd/system/tributary.service 2>/dev/null | head -n 1)
  if ! $verified_unit && [ -n "$unit" ]; then
    check "systemd-analyze verify tributary.service (no error, no warning)" verify_unit "$root" "$unit"
    verified_unit=true
  fi
  execstart=$(sed -n 's/^ExecStart=//p' "$unit")
  read -ra cmd <<<"$execstart"
  sed -i "s/^listen = .*/listen = \"127.0.0.1:$API\"/" "$root/etc/tributary/tributary.toml"
  (chroot_exec_into "$root" -- "${cmd[@]}") >"$WORK/$suite-daemon.log" 2>&1 &
  PIDS+=($!)
  daemon=$!
  check "$suite: daemon started as ExecStart=$execstart answers" wait_http "http://127.0.0.1:$API/api/v1/health" "" 20
  check "$suite: the daemon applies a static binding (tributary binding add)" add_binding
  check "$suite: nginx serves the binding's upstream" wait_http "http://127.0.0.1:$P0/api" "static binding backend"
  check "$suite: UI password file 0600, the password in no log" bash -c '
    f="$1/var/lib/tributary/ui-initial-password"
    [ "$(stat -c %a "$f")" = 600 ] || { stat "$f"; exit 1; }
    pw=$(cat "$f"); [ ${#pw} -ge 8 ] || exit 1
    ! grep -rqF "$pw" "$2" "$1/var/log" ' _ "$root" "$WORK/$suite-daemon.log"
  check "$suite: binding removed, its file gone" remove_binding
  kill "$daemon" 2>/dev/null
  wait "$daemon" 2>/dev/null
  X /usr/sbin/nginx -s quit
  for _ in $(seq 50); do [ -f "$root/run/nginx.pid" ] || break; sleep 0.1; done
  rm -f "$root/etc/nginx/conf.d/tributary-test.conf"
  ln -s /etc/nginx/sites-available/default "$root/etc/nginx/sites-enabled/default"
  TEST_S=$(($(date +%s) - T_TEST))

  check "$suite: purge, then autoremove --purge" X apt-get purge -y -q --autoremove tributary libnginx-mod-http-combined-upstreams
  X apt-get autoremove --purge -y -q >/dev/null 2>&1
  check "$suite: after purge the tree is as before the install" \
    diff <(echo "$before") <(snapshot "$root")
  echo "   $suite: install $INSTALL_S s, tests $TEST_S s, whole suite $(($(date +%s) - T_SUITE)) s"
  rm -rf --one-file-system "$WORK/$suite"
done

count_summary "== packages: "
