# shellcheck shell=bash
# The module built against the nginx of a Debian suite (bookworm 1.22, trixie 1.26, sid 1.30), shared by
# scripts/test-nginx-versions.sh and scripts/package.sh. Source it from the repository root, after
# scripts/lib/chroot.sh. Needs root (chroots).
#
#   nginx_suite_root SUITE           print the cached chroot of SUITE with nginx, nginx-dev and the modules
#                                    module/t loads (made once per machine)
#   nginx_suite_version ROOT         print the nginx version of that chroot (e.g. 1.26.3)
#   nginx_suite_abi ROOT             print the nginx-abi-* virtual package its nginx provides
#   nginx_suite_module SUITE         build the module against SUITE's headers; print the .so's path
#
# Per suite, under target/nginx-versions/SUITE/: nginx-build/ (Debian's configure of the chroot's header
# tree, run with that tree's conf_flags), cargo/ (the CARGO_TARGET_DIR of the build, so the suites do not
# rebuild each other's nginx-sys; a suite's first build starts from a copy of another suite's), build.log.

NGINX_SUITE_PACKAGES=(nginx nginx-dev libnginx-mod-http-echo)

nginx_suite_root() {
  chroot_with_packages "${1:?nginx_suite_root SUITE}" minbase "${NGINX_SUITE_PACKAGES[@]}"
}

nginx_suite_version() {
  dpkg-query --admindir="${1:?nginx_suite_version ROOT}/var/lib/dpkg" -W -f='${Version}' nginx \
    | sed 's/^[0-9]*://; s/-[^-]*$//'
}

nginx_suite_abi() {
  local abi
  abi=$(dpkg-query --admindir="${1:?nginx_suite_abi ROOT}/var/lib/dpkg" -W -f='${Provides}' nginx \
    | tr ',' '\n' | sed 's/^ *//; s/ .*//' | grep '^nginx-abi-')
  [ -n "$abi" ] || { echo "nginx-suites.sh: the nginx of $1 provides no nginx-abi-*" >&2; return 1; }
  printf '%s\n' "$abi"
}

# Debian's configure of ROOT's header tree into BUILD (skipped when BUILD was made from the same nginx-dev).
_nginx_suite_configure() {
  local root=$1 build=$2 stamp
  stamp=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' nginx-dev) || return 1
  if [ -f "$build/ngx_auto_config.h" ] && [ "$(cat "$build/.nginx-dev-version" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  rm -rf "$build"
  mkdir -p "$build"
  (
    cd "$root/usr/share/nginx/src" || exit 1
    # shellcheck disable=SC1091
    . ./conf_flags
    ./configure "${NGX_CONF_FLAGS[@]}" --builddir="$build" >"$build/configure.log" 2>&1
  ) || {
    echo "nginx-suites.sh: configure failed; see $build/configure.log" >&2
    tail -n 5 "$build/configure.log" >&2
    return 1
  }
  echo "$stamp" >"$build/.nginx-dev-version"
}

nginx_suite_module() {
  local suite=${1:?nginx_suite_module SUITE} root out
  root=$(nginx_suite_root "$suite") || return 1
  out="$PWD/target/nginx-versions/$suite"
  mkdir -p "$out"
  _nginx_suite_configure "$root" "$out/nginx-build" || return 1
  # First build of this suite: start from another suite's target dir, so only nginx-sys, ngx and the
  # module compile (the other crates do not depend on nginx's headers).
  local seed
  if [ ! -d "$out/cargo/release" ]; then
    for seed in "$PWD"/target/nginx-versions/*/cargo/release; do
      [ -d "$seed" ] || continue
      mkdir -p "$out/cargo"
      cp -a --reflink=auto "$seed" "$out/cargo/" || rm -rf "$out/cargo"
      break
    done
  fi
  NGINX_SOURCE_DIR="$root/usr/share/nginx/src" NGINX_BUILD_DIR="$out/nginx-build" CARGO_TARGET_DIR="$out/cargo" \
    cargo build --release -p ngx-combined-upstreams >"$out/build.log" 2>&1 || {
    echo "nginx-suites.sh: cargo build against $suite's nginx failed; see $out/build.log" >&2
    grep -m 5 -A 8 '^error' "$out/build.log" >&2
    return 1
  }
  printf '%s\n' "$out/cargo/release/libngx_http_combined_upstreams_module.so"
}
