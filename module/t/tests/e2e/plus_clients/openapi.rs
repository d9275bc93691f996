//! (e) schemathesis (`target/venv`, installed by `scripts/setup.sh test`, as for the daemon's
//! API in `crates/daemon/tests/e2e/web/openapi.rs`) against nginx with the module, from our OpenAPI
//! description of the Plus subset served, `docs/plus-api.openapi.yaml`: no 5xx answer, and every
//! answer's status, content type and body as documented. Writes are on, so its generated `POST`,
//! `PATCH` and `DELETE` requests really change `app`; nginx must log no alert and keep its
//! workers.

use std::process::Command;

use ngx_harness::{check, workspace_root, CaseResult, Completion, Failed};

use super::master::Master;
use super::tools::conf;

pub fn case_schemathesis() -> Result<Completion, Failed> {
    run().map(|()| Completion::Completed)
}

fn run() -> CaseResult {
    let root = workspace_root();
    let venv = std::env::var_os("TRIBUTARY_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target/venv"));
    let st = venv.join("bin/schemathesis");
    check(st.is_file(), || {
        format!(
            "{} is missing: scripts/setup.sh test installs schemathesis into target/venv",
            st.display()
        )
    })?;
    let doc = root.join("docs/plus-api.openapi.yaml");
    let m = Master::start(&conf(
        "upstream app { zone app 1m; server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; }\n\
         upstream quiet { zone quiet 64k; server 127.0.0.1:{P3}; }",
    ))?;
    // Some traffic first, so the statistics are not all zeros.
    for _ in 0..10 {
        ngx_harness::http_request(m.port(0), "GET", "/", &[], b"")?;
    }
    let out = Command::new(&st)
        .arg("run")
        .arg(&doc)
        .args(["--url", &format!("http://127.0.0.1:{}/api", m.port(0))])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        ])
        .args(["--max-examples", "20", "--seed", "1", "--workers", "1"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--request-timeout", "30"])
        .args(["--generation-database", "none", "--no-color"])
        .current_dir(&m.dir)
        .output()
        .map_err(|e| format!("run schemathesis: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    check(out.status.success(), || {
        format!(
            "schemathesis found problems ({}):\n{stdout}\n{stderr}\nnginx error log:\n{}",
            out.status,
            m.error_log()
        )
    })?;
    let log = m.error_log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| ngx_harness::LOG_MARKERS.iter().any(|b| l.contains(b)))
        .collect();
    check(bad.is_empty(), || {
        format!("nginx logged:\n{}", bad.join("\n"))
    })?;
    m.check_workers_unchanged()
}
