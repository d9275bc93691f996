#!/usr/bin/env bash
# Installs what Tributary needs on a fresh Debian machine (bookworm; trixie works too), as root, from
# Debian's archive, crates.io, PyPI and the npm registry. Safe to run again: it only installs what is
# missing. Needs beforehand: root (or sudo) and a Rust toolchain of the workspace's rust-version or newer.
#
#   scripts/setup.sh run    what scripts/run.sh needs: nginx, a C compiler and linker (cc) for
#                           building the daemon and the plugins, nginx-dev and libclang for the module
#   scripts/setup.sh test   (the default) what scripts/test.sh needs: everything of `run`, plus the discovery plugins' registries (dnsmasq,
#                           etcd), the browser tests (Node.js, npm, chromium, playwright-core), the Python
#                           test tools (schemathesis, moto, prometheus_client), promtool, valgrind, wrk and
#                           gdb, the NGINX Plus API clients (prometheus-nginx-exporter, Go and
#                           nginx-plus-go-client), cargo-nextest, rustfmt, clippy
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-test}
case "$MODE" in
  run | test) ;;
  *)
    echo "usage: scripts/setup.sh [run|test]   (run: what scripts/run.sh needs; test, the default: everything)" >&2
    exit 2
    ;;
esac

say() { echo "setup: $*"; }
die() {
  echo "setup: $*" >&2
  exit 1
}

# --- Rust: the one thing this script cannot install for you -------------------------------------------
RUST_VERSION=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n 1)
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    die "cargo is installed in $HOME/.cargo/bin but not on PATH: run \`. \"$HOME/.cargo/env\"\` (or add $HOME/.cargo/bin to PATH) and run this again"
  fi
  die "cargo not found: install a Rust toolchain $RUST_VERSION or newer with rustup (https://rustup.rs:" \
    "curl --proto '=https' -sSf https://sh.rustup.rs | sh), then \`. \"\$HOME/.cargo/env\"\` and run this again"
fi
have_rust=$(rustc --version | awk '{print $2}')
have_rust=${have_rust%%-*}
if [ "$(printf '%s\n%s\n' "$RUST_VERSION" "$have_rust" | sort -V | head -n 1)" != "$RUST_VERSION" ]; then
  die "rustc $have_rust is older than the workspace's rust-version $RUST_VERSION: update Rust" \
    "(\`rustup update stable\`, or install $RUST_VERSION or newer) and run this again"
fi

# --- Debian packages -----------------------------------------------------------------------------------
# run: nginx for the demo; gcc + libc6-dev are cc and the linker cargo uses (ring and the bundled SQLite
# compile C); ca-certificates so cargo reaches crates.io over HTTPS; curl for the README's tour; the nginx
# module the demo loads (live mode): nginx-dev (headers + Debian's configure) and libclang/clang for bindgen;
# protobuf-compiler + libprotobuf-dev: the daemon's etcd client (etcd-client, gRPC) compiles etcd's .proto files
# with protoc, and they import google/protobuf/*.proto, which only libprotobuf-dev ships (a recommendation of
# protobuf-compiler, so --no-install-recommends leaves it out).
APT_PACKAGES=(nginx gcc libc6-dev ca-certificates curl nginx-dev libclang-dev clang protobuf-compiler libprotobuf-dev)
if [ "$MODE" = test ]; then
  # The echo module for module tests; wrk and valgrind for the module benchmarks; sqlite3 for inspecting
  # the store; procps for `kill` (tests stop process groups with it); gdb for the live API test that
  # stops a worker at a breakpoint (holding a lock) before it kills it.
  APT_PACKAGES+=(libnginx-mod-http-echo wrk valgrind sqlite3 procps gdb)
  # Discovery plugin tests: dnsmasq (the binary only, no system service) for `dns`, etcd for `etcd`,
  # openssl for the etcd TLS test's certificates.
  APT_PACKAGES+=(dnsmasq-base etcd-server openssl)
  # Apply tests: chattr (e2fsprogs) makes a tmpfs folder immutable to make a restore fail.
  APT_PACKAGES+=(e2fsprogs)
  # /metrics tests: promtool (`promtool check metrics`, Prometheus' own check of the text format) ships
  # only in Debian's prometheus package. Its service is enabled but not started by the install where
  # no init runs (containers, chroots); on a booted machine `systemctl disable --now prometheus` stops it.
  APT_PACKAGES+=(prometheus)
  # The NGINX Plus API's own clients, for the Plus-compatible API's proof (module/t/tests/e2e/plus_clients/):
  # the official exporter (`prometheus-nginx-exporter -nginx.plus`), and Go with the Go client library
  # nginx-plus-go-client (GOPATH sources in /usr/share/gocode) that module/t/plus-go is built against.
  # bookworm ships exporter 0.11.0, client 0.10.0, go 1.19.
  APT_PACKAGES+=(prometheus-nginx-exporter golang-go golang-github-nginxinc-nginx-plus-go-client-dev)
  # Python test tools (schemathesis, moto) live in a virtualenv in target/venv.
  APT_PACKAGES+=(python3-venv)
  # Web UI browser tests: Debian's chromium driven by playwright-core (npm) on Node.js. Debian's
  # nodejs and npm unless a node and npm are already on PATH (e.g. from another source).
  APT_PACKAGES+=(chromium)
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    APT_PACKAGES+=(nodejs npm)
  fi
  # Debian packages and their checks (scripts/package.sh, scripts/test-packages.sh): debhelper builds them,
  # debootstrap makes the suites' chroots (also for scripts/test-nginx-versions.sh), systemd-analyze
  # verifies the unit.
  APT_PACKAGES+=(debhelper debootstrap systemd)
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null \
    || die "apt-get not found: this set-up installs Debian packages; install these yourself: ${missing[*]}"
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null \
      || die "not root and no sudo: run this as root, or install these Debian packages: ${missing[*]}"
    SUDO=(sudo)
  fi
  say "installing Debian packages: ${missing[*]}"
  log=$(mktemp)
  if ! "${SUDO[@]}" apt-get update -qq >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    die "apt-get update failed (see above); then install these Debian packages: ${missing[*]}"
  fi
  if ! DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    die "apt-get install failed (see above): install these Debian packages: ${missing[*]}"
  fi
  rm -f "$log"
fi

# --- nginx build folder for the module (Debian's configure with Debian's flags; no make needed) --------
BUILD_DIR="$PWD/target/nginx-build"
if [ ! -f "$BUILD_DIR/ngx_auto_config.h" ]; then
  say "configuring nginx headers into $BUILD_DIR"
  mkdir -p "$BUILD_DIR"
  (
    cd /usr/share/nginx/src
    # shellcheck disable=SC1091
    . ./conf_flags
    ./configure "${NGX_CONF_FLAGS[@]}" --builddir="$BUILD_DIR" >"$BUILD_DIR/configure.log" 2>&1
  ) || die "nginx configure failed, see $BUILD_DIR/configure.log"
fi

[ "$MODE" = run ] && exit 0

# --- Rust tools the tests use -------------------------------------------------------------------------
missing_components=()
cargo fmt --version >/dev/null 2>&1 || missing_components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || missing_components+=(clippy)
if [ ${#missing_components[@]} -gt 0 ]; then
  command -v rustup >/dev/null \
    || die "cargo fmt / cargo clippy missing and no rustup: install the Rust components ${missing_components[*]}"
  say "installing Rust components: ${missing_components[*]}"
  rustup component add "${missing_components[@]}" \
    || die "could not add ${missing_components[*]}: run \`rustup component add ${missing_components[*]}\`"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  say "installing cargo-nextest (cargo install --locked cargo-nextest; builds for a few minutes)"
  cargo install --locked cargo-nextest \
    || die "could not install cargo-nextest: install it with \`cargo install --locked cargo-nextest\`"
fi

# --- Web UI browser tests: playwright-core from the npm registry, pinned by tests/browser/package-lock.json
# (it drives Debian's /usr/bin/chromium; no browser download). Its `engines` says which Node.js it needs.
node_major=$(node -p 'process.versions.node.split(".")[0]')
node_min=$(cd tests/browser && node -p "(require('./package-lock.json').packages['node_modules/playwright-core'].engines?.node || '').replace(/[^0-9.]/g, '').split('.')[0] || '0'")
if [ "$node_major" -lt "$node_min" ]; then
  die "Node.js $(node --version) is older than $node_min, which playwright-core needs: install Node.js $node_min or" \
    "newer (Debian's nodejs package on bookworm or later: apt-get install nodejs npm)"
fi
want=$(cd tests/browser && node -p "require('./package-lock.json').packages['node_modules/playwright-core'].version")
have=$(cd tests/browser && node -p "try { require('./node_modules/playwright-core/package.json').version } catch (e) { '' }")
if [ "$want" != "$have" ]; then
  say "npm ci in tests/browser (playwright-core $want)"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
    || die "npm ci in tests/browser failed (see above): it installs playwright-core $want from the npm registry"
fi

# --- Python test tools in target/venv ------------------------------------------------------------------
# schemathesis fuzzes the daemon's JSON API from its OpenAPI document; moto_server (an EC2 API on
# loopback) serves the ec2 plugin's tests; prometheus_client's OpenMetrics parser checks /metrics.
SCHEMATHESIS_VERSION=4.32.5
MOTO_VERSION=5.2.5
PROMETHEUS_CLIENT_VERSION=0.26.0
[ -x target/venv/bin/python ] || python3 -m venv target/venv || die "python3 -m venv target/venv failed"
if ! target/venv/bin/schemathesis --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
  say "installing schemathesis $SCHEMATHESIS_VERSION into target/venv"
  target/venv/bin/pip install -q "schemathesis==$SCHEMATHESIS_VERSION" \
    || die "pip could not install schemathesis==$SCHEMATHESIS_VERSION from PyPI into target/venv"
fi
if ! target/venv/bin/python -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null \
  || [ ! -x target/venv/bin/moto_server ]; then
  say "installing moto[server] $MOTO_VERSION into target/venv"
  target/venv/bin/pip install -q "moto[server]==$MOTO_VERSION" \
    || die "pip could not install moto[server]==$MOTO_VERSION from PyPI into target/venv"
fi
if ! target/venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('prometheus-client') != '$PROMETHEUS_CLIENT_VERSION')" 2>/dev/null; then
  say "installing prometheus-client $PROMETHEUS_CLIENT_VERSION into target/venv"
  target/venv/bin/pip install -q "prometheus-client==$PROMETHEUS_CLIENT_VERSION" \
    || die "pip could not install prometheus-client==$PROMETHEUS_CLIENT_VERSION from PyPI into target/venv"
fi
