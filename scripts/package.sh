#!/usr/bin/env bash
# Builds every Debian package into target/debian/, with dpkg-buildpackage (debhelper) from packaging/:
#   libnginx-mod-http-combined-upstreams_<ver>-1+<deb12|deb13|sid>_amd64.deb   one per suite: the module built
#       against that suite's nginx headers (scripts/lib/nginx-suites.sh), Depends: that nginx's nginx-abi-*
#   tributary_<ver>-1_amd64.deb   the daemon, the plugins, /etc/tributary/tributary.toml, the systemd unit
#
#   scripts/package.sh [SUITE...]        module packages for these suites (default: bookworm trixie sid)
#
# Needs root (the suites' chroots), debhelper, and python3 (plugin.json rewrite). The binaries are cargo
# release builds; the tributary package is built once (on this bookworm host, so it runs on all three).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=$PWD
# shellcheck source=lib/chroot.sh
. scripts/lib/chroot.sh
# shellcheck source=lib/nginx-suites.sh
. scripts/lib/nginx-suites.sh

SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie sid)
OUT="$ROOT_DIR/target/debian"
WORK="$OUT/build"
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
REVISION=1
[ -n "$VERSION" ] || { echo "package: no version in Cargo.toml [workspace.package]" >&2; exit 1; }
command -v dh >/dev/null || { echo "package: debhelper missing (apt-get install debhelper; scripts/setup.sh does)" >&2; exit 1; }
mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK"

suite_suffix() {
  case "$1" in
    bookworm) echo deb12 ;;
    trixie) echo deb13 ;;
    sid) echo sid ;;
  esac
}

# A debian/changelog entry for SOURCE at VERSION (dpkg-buildpackage takes the version from it).
write_changelog() { # DIR SOURCE VERSION DISTRIBUTION
  cat >"$1/debian/changelog" <<EOF
$2 ($3) $4; urgency=medium

  * Built by scripts/package.sh from the Tributary workspace $VERSION.

 -- Tributary maintainers <tributary@example.org>  $(date -R)
EOF
}

# dpkg-buildpackage in DIR; the .deb lands in DIR's parent, moved to target/debian/.
build_in() { # DIR LOG
  (cd "$1" && dpkg-buildpackage -b --no-sign >"$2" 2>&1) || {
    echo "package: dpkg-buildpackage failed in $1; see $2" >&2
    tail -n 15 "$2" >&2
    return 1
  }
  mv "$(dirname "$1")"/*.deb "$OUT/"
  rm -f "$(dirname "$1")"/*.changes "$(dirname "$1")"/*.buildinfo
}

for suite in "${SUITES[@]}"; do
  suffix=$(suite_suffix "$suite")
  [ -n "$suffix" ] || { echo "package: unknown suite $suite" >&2; exit 1; }
  so=$(nginx_suite_module "$suite")
  root=$(nginx_suite_root "$suite")
  abi=$(nginx_suite_abi "$root")
  dir="$WORK/module-$suite/src"
  mkdir -p "$dir"
  cp -r packaging/module/debian "$dir/"
  cp packaging/module/mod-http-combined-upstreams.conf "$dir/"
  cp "$so" "$dir/ngx_http_combined_upstreams_module.so"
  deb_version="$VERSION-$REVISION+$suffix"
  write_changelog "$dir" libnginx-mod-http-combined-upstreams "$deb_version" "$suite"
  rm -f "$OUT"/libnginx-mod-http-combined-upstreams_*+"${suffix}"_amd64.deb
  NGINX_ABI="$abi" build_in "$dir" "$WORK/module-$suite.log"
  echo "package: $OUT/libnginx-mod-http-combined-upstreams_${deb_version}_amd64.deb (nginx $(nginx_suite_version "$root"), Depends: $abi)"
done

# The daemon and the plugins: release builds of every plugins/<name> crate.
plugins=()
for d in plugins/*/; do
  [ -f "$d/plugin.json" ] && plugins+=("$(basename "$d")")
done
cargo_args=(-p tributary)
for p in "${plugins[@]}"; do cargo_args+=(-p "tributary-plugin-$p"); done
# PACKAGE_PROFILE=dev packages the debug build instead (quicker, for trying the packaging itself).
profile=${PACKAGE_PROFILE:-release}
bin_dir=target/release
[ "$profile" = dev ] && bin_dir=target/debug
cargo build --profile "$profile" --bins "${cargo_args[@]}" >"$WORK/cargo-tributary.log" 2>&1 || {
  echo "package: cargo build failed; see $WORK/cargo-tributary.log" >&2
  exit 1
}
dir="$WORK/tributary/src"
mkdir -p "$dir/bin" "$dir/plugins" "$dir/docs"
cp -r packaging/tributary/debian "$dir/"
cp packaging/tributary/tributary.toml "$dir/"
cp README.md "$dir/"
cp docs/cli.md docs/operations.md docs/api.md docs/ui.md docs/protocol.md "$dir/docs/"
cp "$bin_dir/tributary" "$dir/bin/"
for p in "${plugins[@]}"; do
  mkdir -p "$dir/plugins/$p"
  cp "$bin_dir/tributary-plugin-$p" "$dir/plugins/$p/"
  # The checkout's manifest names its run.sh launcher; the installed one names the binary beside it.
  python3 - "plugins/$p/plugin.json" "$dir/plugins/$p/plugin.json" "tributary-plugin-$p" <<'PY'
import json, sys
src, dst, exe = sys.argv[1:]
m = json.load(open(src))
m["executable"] = exe
with open(dst, "w") as f:
    json.dump(m, f, indent=2)
    f.write("\n")
PY
done
deb_version="$VERSION-$REVISION"
write_changelog "$dir" tributary "$deb_version" unstable
rm -f "$OUT"/tributary_*_amd64.deb
build_in "$dir" "$WORK/tributary.log"
echo "package: $OUT/tributary_${deb_version}_amd64.deb ($profile build; plugins: ${plugins[*]})"
