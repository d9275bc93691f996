#!/bin/sh
# Starts the etcd plugin built in this checkout (`cargo build --workspace --bins`, or --release).
# When both a debug and a release build exist, the newer one runs. CARGO_TARGET_DIR is honoured.
here=$(cd "$(dirname "$0")" && pwd)
target=${CARGO_TARGET_DIR:-$here/../../target}
bin=tributary-plugin-etcd
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
