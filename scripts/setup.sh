#!/usr/bin/env bash
# Installs what building and testing Tributary needs on a fresh Debian bookworm machine, then prepares
# the nginx build folder the module compiles against. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: nginx + headers for the module, libclang for bindgen, wrk for benchmarks,
# the echo module for module tests, sqlite3 for inspecting the store.
APT_PACKAGES=(nginx nginx-dev libclang-dev clang wrk libnginx-mod-http-echo valgrind sqlite3 curl ca-certificates python3-venv)
# Discovery plugin tests: dnsmasq (the binary only, no system service) for `dns`, etcd for `etcd`,
# openssl for the etcd TLS test's certificates.
APT_PACKAGES+=(dnsmasq-base etcd-server openssl)
# Apply tests: chattr (e2fsprogs) makes a tmpfs folder immutable to make a restore fail.
APT_PACKAGES+=(e2fsprogs)
# Web UI browser tests: Debian's chromium, driven by playwright-core from npm (tests/browser).
APT_PACKAGES+=(chromium)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

# nginx build folder for the module (Debian's configure with Debian's flags; no make needed).
BUILD_DIR="$PWD/target/nginx-build"
if [ ! -f "$BUILD_DIR/ngx_auto_config.h" ]; then
  echo "setup: configuring nginx headers into $BUILD_DIR"
  mkdir -p "$BUILD_DIR"
  (
    cd /usr/share/nginx/src
    # shellcheck disable=SC1091
    . ./conf_flags
    ./configure "${NGX_CONF_FLAGS[@]}" --builddir="$BUILD_DIR" >"$BUILD_DIR/configure.log" 2>&1
  ) || { echo "setup: nginx configure failed, see $BUILD_DIR/configure.log" >&2; exit 1; }
fi

# Web UI browser tests: playwright-core from the npm registry, pinned by tests/browser/package-lock.json
# (it drives Debian's /usr/bin/chromium; no browser download).
if ! command -v npm >/dev/null; then
  echo "setup: npm not found; install Node.js and npm first" >&2
  exit 1
fi
want=$(cd tests/browser && node -p "require('./package-lock.json').packages['node_modules/playwright-core'].version")
have=$(cd tests/browser && node -p "try { require('./node_modules/playwright-core/package.json').version } catch (e) { '' }")
if [ "$want" != "$have" ]; then
  echo "setup: npm ci in tests/browser (playwright-core $want)"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# Python test tools in target/venv (shared by the tests that need PyPI packages):
# schemathesis fuzzes the daemon's JSON API from its OpenAPI document.
SCHEMATHESIS_VERSION=4.32.5
[ -x target/venv/bin/python ] || python3 -m venv target/venv
if ! target/venv/bin/schemathesis --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
  echo "setup: installing schemathesis $SCHEMATHESIS_VERSION into target/venv"
  target/venv/bin/pip install -q "schemathesis==$SCHEMATHESIS_VERSION"
fi

# moto_server (an EC2 API on loopback) for the ec2 plugin's tests, in the same virtualenv.
MOTO_VERSION=5.2.5
if ! target/venv/bin/python -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null \
   || [ ! -x target/venv/bin/moto_server ]; then
  echo "setup: installing moto[server] $MOTO_VERSION into target/venv"
  target/venv/bin/pip install -q "moto[server]==$MOTO_VERSION"
fi
