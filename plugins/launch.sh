#!/bin/sh
# The launcher every checked-in plugin folder uses: `exec "$(dirname "$0")/../launch.sh" BIN "$@"`
# in its run.sh starts the binary BIN built in this checkout (`cargo build --workspace --bins`, or
# --release), with the plugin's arguments. When both a debug and a release build exist, the newer
# one runs. CARGO_TARGET_DIR is honoured.
bin=${1:?usage: launch.sh BINARY [ARGS...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
debug=$target/debug/$bin
release=$target/release/$bin
if [ -x "$debug" ] && [ -x "$release" ]; then
    if [ "$release" -nt "$debug" ]; then exec "$release" "$@"; else exec "$debug" "$@"; fi
elif [ -x "$debug" ]; then
    exec "$debug" "$@"
elif [ -x "$release" ]; then
    exec "$release" "$@"
fi
echo "$bin is not built (looked in $target/debug and $target/release): run cargo build --workspace --bins" >&2
exit 127
