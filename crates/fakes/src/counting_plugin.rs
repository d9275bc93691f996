//! A discovery plugin that counts its calls, for the fleet tests and benchmark.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Writes `<root>/plugins/count`, a shell plugin with provider `c` that answers the targets in the
/// file `targets` (a JSON array, read at each call) and appends a line to `<root>/calls` per call;
/// returns `<root>/plugins` (the plugins dir).
pub fn counting_plugin(root: &Path, targets: &Path) -> PathBuf {
    let dir = root.join("plugins/count");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nwhile IFS= read -r line; do\n  id=$(printf '%s\\n' \"$line\" | sed -n 's/.*\"id\":\\([0-9][0-9]*\\).*/\\1/p')\n  echo call >> '{calls}'\n  printf '{{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{{\"targets\":%s}}}}\\n' \"$id\" \"$(cat '{targets}')\"\ndone\n",
            calls = root.join("calls").display(),
            targets = targets.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = serde_json::json!({
        "name": "count",
        "version": "0.1.0",
        "description": "counts its calls",
        "executable": "run.sh",
        "capabilities": ["upstream.discovery"],
        "permissions": ["network"],
        "discovery": {"providers": [{"code": "c", "name": "Counting",
            "configuration": {"fields": []}}]}
    });
    std::fs::write(dir.join("plugin.json"), manifest.to_string()).unwrap();
    root.join("plugins")
}
