//! Test cases run by `libtest-mimic` (the module tests and the benches): the case result type,
//! checks that name what was expected, `nginx -t` on a configuration ([`config_test`],
//! [`expect_emerg`], [`expect_ok`]), and [`run_tests`], which ends with a `N passed, N failed`
//! line.

use libtest_mimic::{Failed, Trial};

use crate::options::{check_prerequisites, nginx_bin, nginx_command, temp_prefix, write_config};
use crate::{dead_port, free_ports, Options, PORTS};

/// Result type of a test case.
pub type CaseResult = Result<(), Failed>;

/// Outcome of `nginx -t`: whether it succeeded, and its stderr.
#[derive(Debug)]
pub struct ConfigTest {
    /// `nginx -t` exited 0.
    pub ok: bool,
    /// Everything nginx printed on stderr.
    pub stderr: String,
}

/// Runs `nginx -t` (the module loaded) on an `http {}` body (placeholders filled with free ports).
pub fn config_test(http: &str) -> Result<ConfigTest, String> {
    config_test_with("", http)
}

/// [`config_test`] with extra main-context lines (e.g. `env NAME;`).
pub fn config_test_with(main_extra: &str, http: &str) -> Result<ConfigTest, String> {
    check_prerequisites(true)?;
    let dir = temp_prefix("cu-nginx-")?;
    let ports = free_ports(PORTS);
    let opts = Options::new().main(main_extra);
    let conf = write_config(dir.path(), &opts, http, &ports, dead_port())?;
    let out = nginx_command(dir.path(), &conf, &[])
        .arg("-t")
        .output()
        .map_err(|e| format!("run {}: {e}", nginx_bin().display()))?;
    Ok(ConfigTest {
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Checks that `nginx -t` rejects the configuration with an `[emerg]` line containing `expected`.
pub fn expect_emerg(http: &str, expected: &str) -> CaseResult {
    let t = config_test(http)?;
    if t.ok {
        return Err(
            format!("nginx -t accepted the configuration; expected [emerg] {expected:?}").into(),
        );
    }
    let hit = t
        .stderr
        .lines()
        .any(|l| l.contains("[emerg]") && l.contains(expected));
    if !hit {
        return Err(format!(
            "expected [emerg] containing {expected:?}, nginx said:\n{}",
            t.stderr
        )
        .into());
    }
    Ok(())
}

/// Checks that `nginx -t` accepts the configuration; returns its stderr (warnings).
pub fn expect_ok(http: &str) -> Result<String, Failed> {
    let t = config_test(http)?;
    if !t.ok {
        return Err(format!("nginx -t failed:\n{}", t.stderr).into());
    }
    Ok(t.stderr)
}

/// Checks a condition inside a case; the message names what was expected.
pub fn check(cond: bool, msg: impl FnOnce() -> String) -> CaseResult {
    if cond {
        Ok(())
    } else {
        Err(msg().into())
    }
}

/// Checks equality inside a case.
pub fn check_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> CaseResult {
    check(got == want, || {
        format!("{what}: got {got:?}, want {want:?}")
    })
}

/// Runs the trials like the standard test harness (so `cargo nextest` can list and run each
/// one), then prints `N passed, N failed` and exits with the harness's code.
pub fn run_tests(trials: Vec<Trial>) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let listing = args.list;
    let conclusion = libtest_mimic::run(&args, trials);
    if !listing {
        println!(
            "{} passed, {} failed",
            conclusion.num_passed, conclusion.num_failed
        );
    }
    conclusion.exit()
}
