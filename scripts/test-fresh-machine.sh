#!/usr/bin/env bash
# The README's two commands on a fresh machine: in a fresh copy of a cached `debootstrap --variant=minbase`
# Debian chroot (bookworm unless TRIBUTARY_FRESH_SUITE says otherwise) with this machine's Rust toolchain
# mounted read-only, runs `scripts/setup.sh run` (what scripts/run.sh runs first), checks that running's
# tools are there and the test tools are not, then runs `scripts/setup.sh test` (what scripts/test.sh runs
# first) and checks every tool the build, the demo and the tests use. Also checks the set-up's messages
# when Rust is missing or too old. Prints one line per check and `N passed, N failed`; exits non-zero
# when a check failed. Needs root.
#
# Caches (machine-wide, ${TRIBUTARY_CHROOT_CACHE:-/var/cache/tributary/chroots}, see scripts/lib/chroot.sh):
# the base chroot, Debian's .deb files and package lists, pip's and npm's download caches. The chroot
# copy itself is new every run, on a tmpfs that is gone at the end (TRIBUTARY_FRESH_KEEP=1 puts it on disk in
# /var/tmp and keeps it for a look); the log of every command run in it is target/fresh-machine/<suite>.log,
# run.sh's output target/fresh-machine/<suite>-run.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
# The whole suite runs in its own mount namespace: the tmpfs holding the chroot copy (below) vanishes with
# it, also when the suite is killed. Removing a 2 GB chroot from disk costs minutes; unmounting a tmpfs none.
if [ "${TRIBUTARY_FRESH_NS:-}" != 1 ] && [ "$(id -u)" -eq 0 ]; then
  exec unshare -m --propagation private env TRIBUTARY_FRESH_NS=1 bash "$0" "$@"
fi
# shellcheck source=scripts/lib/chroot.sh
. scripts/lib/chroot.sh
# shellcheck source=scripts/lib/count.sh
. scripts/lib/count.sh

SUITE=${TRIBUTARY_FRESH_SUITE:-bookworm}
pass() {
  echo "PASS $1"
  count_pass "$1"
}
fail() {
  echo "FAIL $1${2:+: $2}"
  count_fail "$1"
}
finish() {
  count_summary
  exit
}

[ "$(id -u)" -eq 0 ] || {
  fail "runs as root" "debootstrap and mount namespaces need root"
  finish
}

WORK=$(mktemp -d /var/tmp/tributary-fresh.XXXXXX)
# TRIBUTARY_FRESH_TMPFS=0 keeps the copy on disk (for a machine short of memory: it needs about 2.5 GB).
if [ "${TRIBUTARY_FRESH_TMPFS:-1}" = 1 ] && [ "${TRIBUTARY_FRESH_KEEP:-0}" != 1 ]; then
  mount -t tmpfs -o size=6g,mode=0755 tributary-fresh "$WORK" || exit 1
fi
ROOT=$WORK/root
mkdir -p "$REPO/target/fresh-machine"
LOG=$REPO/target/fresh-machine/$SUITE.log
: >"$LOG"
cleanup() {
  if [ "${TRIBUTARY_FRESH_KEEP:-0}" = 1 ]; then
    echo "fresh-machine: kept $WORK"
  elif mountpoint -q "$WORK"; then
    umount "$WORK" && rmdir "$WORK"
  else
    _chroot_remove "$WORK" || echo "fresh-machine: could not remove $WORK" >&2
  fi
}
trap cleanup EXIT

# --- The set-up's messages when Rust is missing or too old (on this machine: they stop before apt) --------
rust_version=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n 1)
# A PATH with the few tools the set-up uses before its Rust check, and no cargo (wherever this machine has one).
mkdir -p "$WORK/nocargo"
for t in dirname sed head awk sort id; do ln -s "$(command -v "$t")" "$WORK/nocargo/$t"; done
out=$(env -i PATH="$WORK/nocargo" HOME="$WORK/nohome" "$BASH" scripts/setup.sh run 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "install a Rust toolchain $rust_version or newer with rustup" <<<"$out"; then
  pass "no cargo: the set-up says to install Rust $rust_version+ with rustup"
else
  fail "no cargo: the set-up says to install Rust $rust_version+ with rustup" "exit $rc, said: $out"
fi
mkdir -p "$WORK/oldrust"
printf '#!/bin/sh\necho "rustc 1.70.0 (90c541806 2023-05-31)"\n' >"$WORK/oldrust/rustc"
printf '#!/bin/sh\necho "cargo 1.70.0"\n' >"$WORK/oldrust/cargo"
chmod +x "$WORK/oldrust/rustc" "$WORK/oldrust/cargo"
out=$(env -i PATH="$WORK/oldrust:/usr/bin:/bin" HOME="$WORK/nohome" bash scripts/setup.sh run 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "rustc 1.70.0 is older than the workspace's rust-version $rust_version" <<<"$out"; then
  pass "rustc older than rust-version: the set-up says so"
else
  fail "rustc older than rust-version: the set-up says so" "exit $rc, said: $out"
fi
out=$(bash scripts/setup.sh nonsense 2>&1)
rc=$?
if [ $rc -eq 2 ] && grep -q "usage: scripts/setup.sh \[run|test\]" <<<"$out"; then
  pass "unknown set-up mode: usage, exit 2"
else
  fail "unknown set-up mode: usage, exit 2" "exit $rc, said: $out"
fi

# --- A fresh chroot with the source tree and this machine's Rust toolchain ------------------------------
start=$(date +%s)
if ! chroot_copy "$SUITE" minbase "$ROOT" >"$LOG" 2>&1; then
  fail "fresh $SUITE minbase chroot" "$(tail -n 5 "$LOG")"
  finish
fi
pass "fresh $SUITE minbase chroot ($(($(date +%s) - start)) s)"

# The source tree as a checkout has it (tracked and untracked files, no target/ or node_modules/).
mkdir -p "$ROOT/src/tributary"
git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _ \
  | tar -c --null -T - -f - | tar -x -C "$ROOT/src/tributary"

# This workplace's network may present its own CA (a TLS-inspecting egress): a fresh machine here has it
# in /usr/local/share/ca-certificates, and Debian's ca-certificates (installed by the set-up) trusts it.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
fi

rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=$(dirname "$(command -v cargo)")
binds=(--ro-bind "$cargo_bin")
[ -d "$rustup_home" ] && binds+=(--ro-bind "$rustup_home")
nextest=$(command -v cargo-nextest || true)
if [ -n "$nextest" ] && [ "$(dirname "$nextest")" != "$cargo_bin" ]; then
  binds+=(--ro-bind "$nextest:/usr/local/bin/cargo-nextest")
fi
cache=$(chroot_cache_dir)
archives=$(chroot_apt_archives "$SUITE")
mkdir -p "$cache/lists/$SUITE/partial" "$cache/pip" "$cache/npm"
binds+=(--bind "$archives:/var/cache/apt/archives" --bind "$cache/lists/$SUITE:/var/lib/apt/lists")
binds+=(--bind "$cache/pip:/root/.cache/pip" --bind "$cache/npm:/root/.npm")
envs=(--env "PATH=$cargo_bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
[ -d "$rustup_home" ] && envs+=(--env "RUSTUP_HOME=$rustup_home")
envs+=(--env CARGO_HOME=/root/.cargo --env CARGO_TERM_COLOR=never)
# The CA-bundle variables this machine's environment sets (CI keeps them); the paths exist in the chroot
# once ca-certificates is installed.
for v in SSL_CERT_FILE SSL_CERT_DIR NODE_EXTRA_CA_CERTS PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE; do
  [ -n "${!v:-}" ] && envs+=(--env "$v=${!v}")
done

# in_root NAME SCRIPT: runs SCRIPT with bash in the chroot (in /src/tributary), output to the log.
in_root() {
  local name=$1 script=$2
  echo "== $name" >>"$LOG"
  chroot_exec "$ROOT" "${binds[@]}" "${envs[@]}" -- bash -c "cd /src/tributary && $script" >>"$LOG" 2>&1
}
check() {
  local name=$1 script=$2
  if in_root "$name" "$script"; then pass "$name"; else fail "$name" "see the lines after '== $name' in the log"; fi
}

# One fresh-machine test at a time per machine: the apt caches are shared.
exec 8>"$cache/fresh-$SUITE.lock"
flock 8

check "the Rust toolchain runs read-only in the chroot" "cargo --version && rustc --version"
check "no cc on the bare chroot (it must come from the set-up)" "! command -v cc"

# --- scripts/setup.sh run: what scripts/run.sh needs, and nothing of the tests -----------------------
start=$(date +%s)
check "scripts/setup.sh run exits 0" "scripts/setup.sh run"
run_secs=$(($(date +%s) - start))
check "run: nginx" "nginx -v"
check "run: cc" "cc --version"
check "run: cargo compiles and links a binary with cc" \
  "cd /tmp && rm -rf hello && cargo new -q --offline --vcs none hello && cd hello && cargo build -q --offline && ./target/debug/hello | grep -q 'Hello, world'"
check "run: ca-certificates (cargo reaches crates.io over HTTPS)" "test -s /etc/ssl/certs/ca-certificates.crt"
check "run: no Node.js" "! command -v node && ! command -v nodejs"
check "run: no npm" "! command -v npm"
check "run: no chromium" "! test -e /usr/bin/chromium"
check "run: no valgrind" "! command -v valgrind"
check "run: no Python test tools (no python3-venv, no target/venv)" \
  "! dpkg-query -W -f='\${Status}' python3-venv 2>/dev/null | grep -q 'install ok installed' && ! test -e target/venv"
check "run: no etcd, no dnsmasq" "! command -v etcd && ! command -v dnsmasq"
check "run: nginx-dev headers and clang (the demo loads the module, built here)" \
  "test -f /usr/share/nginx/src/conf_flags && clang --version && test -f target/nginx-build/ngx_auto_config.h"

# --- scripts/run.sh itself on the run set-up: it builds, starts nginx and the daemon, serves the demo ----
# Free ports on 127.0.0.1 (the chroot shares this machine's network): the demo's front port and the two
# after it, and the API port.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
front=0
for _ in $(seq 1 50); do
  p=$((20000 + RANDOM % 40000))
  if port_free "$p" && port_free $((p + 1)) && port_free $((p + 2)) && port_free $((p + 3)); then
    front=$p
    break
  fi
done
api=$((front + 3))
# The cargo build is cached between runs (machine-wide target dir and registry); the tools are not.
mkdir -p "$cache/cargo-target/$SUITE" "$cache/cargo-registry"
RUNLOG=$REPO/target/fresh-machine/$SUITE-run.log
start=$(date +%s)
set -m # run.sh in its own process group, with SIGINT as a terminal would send it
# ... and with SIGINT and SIGQUIT at their defaults: a suite started in the background (CI runners,
# `cmd &` in a script) inherits them ignored, and a shell cannot trap a signal ignored at its start,
# so run.sh's Ctrl-C handler would silently not be there (`env --default-signal`, coreutils 8.31+).
chroot_exec "$ROOT" "${binds[@]}" --bind "$cache/cargo-target/$SUITE:/var/cache/tributary-target" \
  --bind "$cache/cargo-registry:/root/.cargo/registry" "${envs[@]}" \
  --env CARGO_TARGET_DIR=/var/cache/tributary-target --env "TRIBUTARY_DEMO_PORT=$front" \
  --env "TRIBUTARY_API_PORT=$api" -- \
  bash -c 'cd /src/tributary && echo $$ >/tmp/run.sh.pid && exec env --default-signal=INT,QUIT scripts/run.sh' >"$RUNLOG" 2>&1 &
run_job=$!
set +m
running=0
for _ in $(seq 1 3600); do # the first (uncached) build takes minutes
  grep -q "Tributary is running" "$RUNLOG" && running=1 && break
  kill -0 "$run_job" 2>/dev/null || break
  sleep 1
done
if [ $running = 1 ]; then
  pass "scripts/run.sh builds and starts on the run set-up ($(($(date +%s) - start)) s)"
else
  fail "scripts/run.sh builds and starts on the run set-up" "see $RUNLOG"
fi
bodies=""
for _ in 1 2 3 4; do
  bodies+=$(curl -s --max-time 5 "http://127.0.0.1:$front/")" "
done
if grep -q "backend one" <<<"$bodies" && grep -q "backend two" <<<"$bodies"; then
  pass "scripts/run.sh: the demo answers through the generated upstream (both backends)"
else
  fail "scripts/run.sh: the demo answers through the generated upstream (both backends)" "got: $bodies"
fi
run_pid=$(cat "$ROOT/tmp/run.sh.pid" 2>/dev/null || true)
[ -n "$run_pid" ] && kill -INT "$run_pid" 2>/dev/null
stopped=0
for _ in $(seq 1 30); do
  kill -0 "$run_job" 2>/dev/null || { stopped=1; break; }
  sleep 1
done
if [ $stopped = 1 ] && grep -q "== stopping" "$RUNLOG" && port_free "$front" && port_free "$api"; then
  pass "scripts/run.sh: Ctrl-C stops the daemon and nginx"
else
  fail "scripts/run.sh: Ctrl-C stops the daemon and nginx" "see $RUNLOG"
  kill -KILL -- -"$run_job" 2>/dev/null
fi
wait "$run_job" 2>/dev/null
check "run.sh on the run set-up still installed no test tools" \
  "! command -v node && ! test -e /usr/bin/chromium && ! command -v valgrind && ! command -v go && ! test -e target/venv"

# --- scripts/setup.sh test: everything the build and the tests use ------------------------------------
start=$(date +%s)
check "scripts/setup.sh test exits 0" "scripts/setup.sh test"
test_secs=$(($(date +%s) - start))
check "test: nginx" "nginx -v"
check "test: nginx-dev headers in /usr/share/nginx/src" "test -f /usr/share/nginx/src/src/core/nginx.h && test -f /usr/share/nginx/src/conf_flags"
check "test: Debian's configure ran into target/nginx-build" "test -f target/nginx-build/ngx_auto_config.h"
check "test: clang" "clang --version"
check "test: libclang (for bindgen)" "compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null"
check "test: cc" "cc --version"
check "test: node" "node --version"
check "test: npm" "npm --version"
check "test: node satisfies playwright-core's engines" \
  "node -e \"const e = require('./tests/browser/package-lock.json').packages['node_modules/playwright-core'].engines.node; const min = +e.replace(/[^0-9.]/g, '').split('.')[0]; if (+process.versions.node.split('.')[0] < min) { console.error(process.version, 'does not satisfy', e); process.exit(1) }\""
check "test: python3 -m venv" "python3 -m venv /tmp/venv-check && /tmp/venv-check/bin/python -c 'import sys; print(sys.version)'"
check "test: chromium" "test -x /usr/bin/chromium && chromium --version"
check "test: etcd" "etcd --version"
check "test: dnsmasq" "dnsmasq --version"
check "test: wrk" "command -v wrk"
check "test: valgrind" "valgrind --version"
check "test: gdb" "gdb --version"
check "test: promtool (prometheus)" "promtool --version"
check "test: sqlite3" "sqlite3 --version"
check "test: openssl" "openssl version"
check "test: chattr (e2fsprogs)" "command -v chattr"
check "test: kill (procps)" "test -x /usr/bin/kill || test -x /bin/kill"
check "test: nginx echo module" "compgen -G '/usr/lib/nginx/modules/ngx_http_echo_module.so' >/dev/null"
check "test: prometheus-nginx-exporter (NGINX Plus API scraping)" "prometheus-nginx-exporter -version 2>&1 | grep -q 'version='"
check "test: go builds module/t/plus-go against Debian's nginx-plus-go-client" \
  "GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=/tmp/plus-go-cache go build -o /tmp/plus-go ./module/t/plus-go && /tmp/plus-go help"
check "test: schemathesis in target/venv" "target/venv/bin/schemathesis --version"
check "test: moto_server in target/venv" "test -x target/venv/bin/moto_server && target/venv/bin/python -c 'import moto; print(moto.__version__)'"
check "test: prometheus_client's OpenMetrics parser in target/venv" "target/venv/bin/python -c 'from prometheus_client.openmetrics.parser import text_string_to_metric_families'"
check "test: playwright-core in tests/browser as the lock pins it" \
  "cd tests/browser && test \"\$(node -p \"require('./node_modules/playwright-core/package.json').version\")\" = \"\$(node -p \"require('./package-lock.json').packages['node_modules/playwright-core'].version\")\""
# A real headless chromium launch through playwright-core on this Node.js (what tests/browser does).
cat >"$ROOT/src/tributary/tests/browser/fresh-launch.mjs" <<'EOF'
import { chromium } from "playwright-core";
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true });
const page = await browser.newPage();
await page.setContent("<p id=p>sum</p><script>document.getElementById('p').textContent += ' ' + (40 + 2)</script>");
const text = await page.textContent("#p");
console.log(`node ${process.version}, chromium ${browser.version()}: ${text}`);
await browser.close();
if (text !== "sum 42") process.exit(1);
EOF
check "test: playwright-core drives Debian's chromium headless on Debian's Node.js" "cd tests/browser && node fresh-launch.mjs"
check "test: cargo nextest" "cargo nextest --version"
check "test: cargo fmt, cargo clippy" "cargo fmt --version && cargo clippy --version"
check "test: a second scripts/setup.sh test installs nothing" \
  "out=\$(scripts/setup.sh test 2>&1) && echo \"\$out\" && ! echo \"\$out\" | grep -q 'setup: installing'"
in_root "prune outdated .debs from the shared cache" "apt-get autoclean -qq" || true

# Every mount chroot_exec made is gone with its namespace.
if findmnt -rn -o TARGET | grep -q "^$ROOT"; then
  fail "no mounts left below the chroot" "$(findmnt -rn -o TARGET | grep "^$ROOT" | tr '\n' ' ')"
else
  pass "no mounts left below the chroot"
fi

echo "fresh-machine: $SUITE, setup.sh run ${run_secs}s, setup.sh test ${test_secs}s; log: $LOG"
if [ "$failed" -gt 0 ]; then
  echo "fresh-machine: failed: ${failures[*]}"
  echo "---- last 40 lines of the log"
  tail -n 40 "$LOG"
fi
finish
