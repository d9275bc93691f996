//! Test harness for the combined-upstreams module: runs Debian's `/usr/sbin/nginx` with the
//! module loaded, on free loopback ports, in a temporary prefix. (Skeleton: the API grows in the
//! next commits.)

use std::path::PathBuf;

/// Environment variable that overrides where the module `.so` is looked up.
pub const MODULE_ENV: &str = "COMBINED_UPSTREAMS_MODULE";

/// Path of the module `.so`: `$COMBINED_UPSTREAMS_MODULE`, else the release build output.
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os(MODULE_ENV) {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/release/libngx_http_combined_upstreams_module.so")
}
