//! The Debian tools these cases drive: `go` with nginx-plus-go-client's sources (to build
//! `module/t/plus-go`), `prometheus-nginx-exporter`; how a missing one is treated; the nginx
//! configuration the cases share.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use ngx_harness::{workspace_root, Completion, Failed};

/// Where Debian's golang-github-nginxinc-nginx-plus-go-client-dev puts the client's sources.
pub const GOPATH: &str = "/usr/share/gocode";
const CLIENT_SRC: &str =
    "/usr/share/gocode/src/github.com/nginxinc/nginx-plus-go-client/client/nginx.go";
pub const EXPORTER: &str = "prometheus-nginx-exporter";

/// The Plus API location of every case: `/api` (the clients ask `GET /api` for the versions and
/// `/api/8/...` for the rest), loopback only, writes allowed.
pub const PLUS_LOCATION: &str = "location /api { allow 127.0.0.1; deny all; \
     client_max_body_size 1m; upstreams_api plus write=on; }";

/// A backend on `{Pi}`: `X-Backend: bi` on every answer; `/` answers 200, `/s/404` 404,
/// `/s/500` 500, `/s/302` a redirect.
pub fn backend(i: usize) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}}; add_header X-Backend b{i} always;\n\
         location / {{ return 200 \"b{i}\\n\"; }}\n\
         location = /s/404 {{ return 404 \"b{i}\\n\"; }}\n\
         location = /s/500 {{ return 500 \"b{i}\\n\"; }}\n\
         location = /s/302 {{ return 302 /elsewhere; }} }}\n"
    )
}

/// `upstreams` (inside `http {}`), then the front server on `{P0}` (`/` to `app`, `/quiet/` to
/// `quiet` when `upstreams` has it), the Plus API and backends b1…b5.
pub fn conf(upstreams: &str) -> String {
    let quiet = if upstreams.contains("upstream quiet ") {
        "location /quiet/ { proxy_pass http://quiet; }\n"
    } else {
        ""
    };
    format!(
        "{upstreams}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport; add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream_tries 1; }}\n\
         {quiet}{PLUS_LOCATION}\n}}\n{}",
        (1..=5).map(backend).collect::<String>()
    )
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// `Ok(None)` when every tool is there; else, outside CI, a loud skip; with `CI=true`, a failure.
pub fn require(tools: &[&str]) -> Result<Option<Completion>, Failed> {
    let mut missing = Vec::new();
    for t in tools {
        let there = match *t {
            "go" => on_path("go").is_some() && Path::new(CLIENT_SRC).is_file(),
            other => on_path(other).is_some(),
        };
        if !there {
            missing.push(match *t {
                "go" => "go (golang-go) and nginx-plus-go-client (golang-github-nginxinc-nginx-plus-go-client-dev)",
                other => other,
            });
        }
    }
    if missing.is_empty() {
        return Ok(None);
    }
    let why = format!(
        "missing Debian tools: {}; `scripts/setup.sh test` installs them",
        missing.join(", ")
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        return Err(format!("{why} (CI=true: a missing tool fails the test)").into());
    }
    eprintln!("\n!!!!! SKIPPED: {why} !!!!!\n");
    Ok(Some(Completion::ignored_with(why)))
}

/// Builds `module/t/plus-go` (once per process) against Debian's client in GOPATH mode; output
/// and Go's build cache under `target/plus-go/` (CI caches `target/`). Built to a file of this
/// process and renamed into place, so test processes building at once never run a half-written
/// binary.
pub fn plus_go() -> Result<PathBuf, Failed> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = workspace_root();
        let dir = root.join("target/plus-go");
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let bin = dir.join("plus-go");
        let tmp = dir.join(format!("plus-go.{}", std::process::id()));
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&tmp)
            .arg("./module/t/plus-go")
            .current_dir(&root)
            .env("GO111MODULE", "off")
            .env("GOPATH", GOPATH)
            .env("GOCACHE", dir.join("cache"))
            .env("GOFLAGS", "")
            .env("GOENV", "off")
            .output()
            .map_err(|e| format!("run go build: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!(
                "go build ./module/t/plus-go failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::rename(&tmp, &bin).map_err(|e| format!("rename {}: {e}", tmp.display()))?;
        Ok(bin)
    })
    .clone()
    .map_err(Failed::from)
}

/// Runs `plus-go ARGS` against the Plus API on `port`; its JSON on success, else its stderr.
pub fn go_client(port: u16, cmd: &str, args: &[&str]) -> Result<serde_json::Value, Failed> {
    let out = go_client_raw(port, cmd, args)?;
    if !out.status.success() {
        return Err(format!(
            "plus-go {cmd} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "plus-go {cmd}: bad JSON {:?}: {e}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?)
}

/// [`go_client`]'s process output, whatever its status.
pub fn go_client_raw(port: u16, cmd: &str, args: &[&str]) -> Result<Output, Failed> {
    Ok(go_command(port, cmd, args)?
        .output()
        .map_err(|e| format!("run plus-go: {e}"))?)
}

/// The `plus-go` command line for `cmd` against `http://127.0.0.1:PORT/api`.
pub fn go_command(port: u16, cmd: &str, args: &[&str]) -> Result<Command, Failed> {
    let mut c = Command::new(plus_go()?);
    c.arg(cmd)
        .arg(format!("http://127.0.0.1:{port}/api"))
        .args(args);
    Ok(c)
}
