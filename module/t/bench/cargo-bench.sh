# Sourced by the module/t/bench/*.sh wrappers: `run_bench NAME [SO]` runs the Rust bench NAME
# (`cargo bench -p combined-upstreams-tests --bench NAME`, module/t/bench/NAME.rs) from the workspace
# root with the module .so SO (else $COMBINED_UPSTREAMS_MODULE, else the release build). cargo runs a
# bench in module/t, so the paths the benches read from the environment are made absolute here.
run_bench() {
  local name=$1 so=${2:-${COMBINED_UPSTREAMS_MODULE:-$PWD/target/release/libngx_http_combined_upstreams_module.so}}
  COMBINED_UPSTREAMS_MODULE="$(readlink -f "$so")"
  export COMBINED_UPSTREAMS_MODULE
  local v
  for v in NGINX_BIN BASE_SO VALGRIND_LOGS; do # absolute, symlinks kept (NGINX_BIN may be a wrapper)
    if [ -n "${!v:-}" ] && [ "${!v#/}" = "${!v}" ]; then printf -v "$v" '%s' "$PWD/${!v}"; export "${v?}"; fi
  done
  exec cargo bench -q -p combined-upstreams-tests --bench "$name"
}
