//! The nginx seam: a trait with `test` and `reload`, the real implementation that runs commands,
//! and reading the conf dir from `nginx -V`.

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::ApplyError;

/// What the apply transaction needs from nginx. Implementations must be safe to call from any
/// thread; the [`crate::Applier`] calls them one at a time.
pub trait Nginx: Send + Sync {
    /// Tests the whole configuration (default `nginx -t`).
    fn test(&self) -> Result<(), CommandError>;
    /// Asks the running nginx to reload its configuration (default `nginx -s reload`).
    fn reload(&self) -> Result<(), CommandError>;
}

impl<T: Nginx + ?Sized> Nginx for Arc<T> {
    fn test(&self) -> Result<(), CommandError> {
        (**self).test()
    }
    fn reload(&self) -> Result<(), CommandError> {
        (**self).reload()
    }
}

impl<T: Nginx + ?Sized> Nginx for Box<T> {
    fn test(&self) -> Result<(), CommandError> {
        (**self).test()
    }
    fn reload(&self) -> Result<(), CommandError> {
        (**self).reload()
    }
}

/// A command that failed: which one, its exit status (`None` when it could not run, was killed
/// or timed out), and its output (stderr and stdout interleaved, exactly as printed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    pub command: String,
    pub status: Option<i32>,
    pub stderr: String,
}

impl CommandError {
    /// The command's own output without the trailing newline: nginx's message, verbatim.
    pub fn output(&self) -> &str {
        self.stderr.trim_end()
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(code) => write!(f, "`{}` failed with exit status {code}", self.command)?,
            None => write!(f, "`{}` failed", self.command)?,
        }
        if self.output().is_empty() {
            Ok(())
        } else {
            write!(f, ":\n{}", self.output())
        }
    }
}

impl std::error::Error for CommandError {}

/// Default time a test or reload command may take before it is killed.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// [`Nginx`] by running commands (argv vectors, no shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandNginx {
    test_cmd: Vec<String>,
    reload_cmd: Vec<String>,
    timeout: Duration,
}

impl Default for CommandNginx {
    /// `nginx -t` and `nginx -s reload`.
    fn default() -> Self {
        CommandNginx::new(
            vec!["nginx".into(), "-t".into()],
            vec!["nginx".into(), "-s".into(), "reload".into()],
        )
    }
}

impl CommandNginx {
    /// Commands as argv vectors, e.g. `["nginx", "-t"]`.
    pub fn new(test_cmd: Vec<String>, reload_cmd: Vec<String>) -> CommandNginx {
        CommandNginx {
            test_cmd,
            reload_cmd,
            timeout: DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// Changes how long a command may run before it is killed and counted as failed.
    pub fn with_timeout(mut self, timeout: Duration) -> CommandNginx {
        self.timeout = timeout;
        self
    }

    /// The test command.
    pub fn test_cmd(&self) -> &[String] {
        &self.test_cmd
    }

    /// The reload command.
    pub fn reload_cmd(&self) -> &[String] {
        &self.reload_cmd
    }
}

impl Nginx for CommandNginx {
    fn test(&self) -> Result<(), CommandError> {
        run_command(&self.test_cmd, self.timeout).map(|_| ())
    }
    fn reload(&self) -> Result<(), CommandError> {
        run_command(&self.reload_cmd, self.timeout).map(|_| ())
    }
}

/// Runs `argv` with stdin closed, collecting stdout and stderr into one text. Success returns the
/// text; failure (non-zero exit, spawn error, timeout) returns a [`CommandError`].
pub fn run_command(argv: &[String], timeout: Duration) -> Result<String, CommandError> {
    let command = argv.join(" ");
    let fail = |status: Option<i32>, stderr: String| CommandError {
        command: command.clone(),
        status,
        stderr,
    };
    let Some((program, args)) = argv.split_first() else {
        return Err(fail(None, "empty command".into()));
    };
    let mut out = tempfile::tempfile().map_err(|e| fail(None, format!("temporary file: {e}")))?;
    let out_for_stdout = out.try_clone().map_err(|e| fail(None, e.to_string()))?;
    let out_for_stderr = out.try_clone().map_err(|e| fail(None, e.to_string()))?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_for_stdout))
        .stderr(Stdio::from(out_for_stderr))
        .spawn()
        .map_err(|e| fail(None, format!("could not run {program}: {e}")))?;
    let started = Instant::now();
    let deadline = started + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(
                    None,
                    format!("timed out after {} s and was killed", timeout.as_secs()),
                ));
            }
            Ok(None) => thread::sleep(poll_pause(started.elapsed())),
            Err(e) => return Err(fail(None, format!("waiting for {program}: {e}"))),
        }
    };
    let mut raw = Vec::new();
    let _ = out
        .seek(SeekFrom::Start(0))
        .and_then(|_| out.read_to_end(&mut raw));
    let text = String::from_utf8_lossy(&raw).into_owned();
    if status.success() {
        Ok(text)
    } else {
        Err(fail(status.code(), text))
    }
}

/// How long to sleep before looking again whether a command ended, `elapsed` after it started:
/// a twentieth of the time so far (0.25 ms … 20 ms), so the exit is seen at most 5 % (or 0.25 ms)
/// late. (`nginx -t` takes a few ms; a doubling pause from 1 ms noticed a 35 ms test only at 51 ms.)
fn poll_pause(elapsed: Duration) -> Duration {
    (elapsed / 20).clamp(Duration::from_micros(250), Duration::from_millis(20))
}

/// The conf dir nginx was built with: runs `<nginx_binary> -V` and reads `--conf-path`
/// (its folder), else `--prefix` + `/conf` (nginx's own default).
pub fn conf_dir_from_nginx_v(nginx_binary: &Path) -> Result<PathBuf, ApplyError> {
    let argv = vec![nginx_binary.display().to_string(), "-V".to_string()];
    let text = run_command(&argv, DEFAULT_COMMAND_TIMEOUT).map_err(|e| ApplyError::NginxV {
        message: e.to_string(),
    })?;
    parse_conf_dir(&text).ok_or_else(|| ApplyError::NginxV {
        message: format!(
            "`{}` shows neither --conf-path nor --prefix; configure the conf dir",
            argv.join(" ")
        ),
    })
}

/// Reads the conf dir from the text `nginx -V` prints. Relative paths are relative to `--prefix`.
pub fn parse_conf_dir(nginx_v_output: &str) -> Option<PathBuf> {
    let arg = |name: &str| -> Option<String> {
        nginx_v_output
            .split_whitespace()
            .find_map(|tok| tok.strip_prefix(name))
            .map(|v| v.trim_matches(['\'', '"']).to_string())
            .filter(|v| !v.is_empty())
    };
    let prefix = arg("--prefix=").map(PathBuf::from);
    if let Some(conf) = arg("--conf-path=") {
        let conf = PathBuf::from(conf);
        let conf = match (&prefix, conf.is_relative()) {
            (Some(p), true) => p.join(conf),
            _ => conf,
        };
        return conf
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty());
    }
    prefix.map(|p| p.join("conf"))
}

/// A path option of `nginx -V` (e.g. `--pid-path=`, `--error-log-path=`), relative paths resolved
/// against `--prefix` as nginx does.
pub fn parse_nginx_v_path(nginx_v_output: &str, option: &str) -> Option<PathBuf> {
    let arg = |name: &str| -> Option<String> {
        nginx_v_output
            .split_whitespace()
            .find_map(|tok| tok.strip_prefix(name))
            .map(|v| v.trim_matches(['\'', '"']).to_string())
            .filter(|v| !v.is_empty())
    };
    let value = PathBuf::from(arg(option)?);
    match arg("--prefix=") {
        Some(prefix) if value.is_relative() => Some(PathBuf::from(prefix).join(value)),
        _ => Some(value),
    }
}

/// The first argument of a directive of the main context (outside every block) of the main
/// configuration file, read from `nginx -T` output (the dump of every file; only the first file,
/// the main one, is read). Comments and quotes are honoured; `None` when the directive is not
/// there. For `pid` and `error_log`, which the daemon needs to confirm reloads.
pub fn main_level_directive(nginx_t_output: &str, directive: &str) -> Option<String> {
    const HEADER: &str = "# configuration file ";
    // The dump starts with the test's own messages, then "# configuration file <main>:".
    let start = nginx_t_output.find(HEADER)?;
    let after = &nginx_t_output[start..];
    let body_start = after.find('\n')? + 1;
    let body = &after[body_start..];
    let body = match body.find(&format!("\n{HEADER}")) {
        Some(end) => &body[..end],
        None => body,
    };
    let mut depth = 0usize;
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' if !in_word => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' | '\'' if !in_word => {
                let quote = c;
                let mut w = String::new();
                while let Some(c) = chars.next() {
                    if c == '\\' {
                        if let Some(n) = chars.next() {
                            w.push(n);
                        }
                    } else if c == quote {
                        break;
                    } else {
                        w.push(c);
                    }
                }
                words.push(w);
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            ';' | '{' | '}' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                if c == ';' && depth == 0 && words.first().is_some_and(|w| w == directive) {
                    return words.get(1).cloned();
                }
                match c {
                    '{' => depth += 1,
                    '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                words.clear();
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    None
}

/// Where the running nginx keeps its pid file and main error log, as far as its configuration
/// tells: found by [`discover_reload_paths`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadPaths {
    pub pid_file: Option<PathBuf>,
    /// `None` when the log is not a file (`stderr`, `syslog:`, `memory:`) or unknown.
    pub error_log: Option<PathBuf>,
}

/// Reads the `pid` and `error_log` of the main context from the configuration the test command
/// checks (`<test command> -T`, which dumps it), else nginx's built-in defaults from
/// `<nginx_binary> -V` (`--pid-path`, `--error-log-path`). Relative paths are resolved against
/// the prefix: the test command's `-p DIR`, else `--prefix` of `nginx -V`.
pub fn discover_reload_paths(nginx_binary: &Path, test_cmd: &[String]) -> ReloadPaths {
    let v = run_command(
        &[nginx_binary.display().to_string(), "-V".to_string()],
        DEFAULT_COMMAND_TIMEOUT,
    )
    .unwrap_or_default();
    let mut dump_cmd = test_cmd.to_vec();
    dump_cmd.push("-T".into());
    let dump = run_command(&dump_cmd, DEFAULT_COMMAND_TIMEOUT).unwrap_or_default();
    let prefix = test_cmd
        .windows(2)
        .find(|w| w[0] == "-p")
        .map(|w| PathBuf::from(&w[1]))
        .or_else(|| parse_nginx_v_path(&v, "--prefix=").map(|p| p.join("")));
    let resolve = |p: String| -> PathBuf {
        let p = PathBuf::from(p);
        match &prefix {
            Some(prefix) if p.is_relative() => prefix.join(p),
            _ => p,
        }
    };
    let pid_file = main_level_directive(&dump, "pid")
        .map(resolve)
        .or_else(|| parse_nginx_v_path(&v, "--pid-path="));
    let not_a_file =
        |l: &str| l == "stderr" || l.starts_with("syslog:") || l.starts_with("memory:");
    let error_log = match main_level_directive(&dump, "error_log") {
        Some(l) if not_a_file(&l) => None,
        Some(l) => Some(resolve(l)),
        // Debian builds nginx with --error-log-path=stderr.
        None => parse_nginx_v_path(&v, "--error-log-path=")
            .filter(|p| !not_a_file(&p.file_name().unwrap_or_default().to_string_lossy())),
    };
    ReloadPaths {
        pid_file,
        error_log,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_end_is_noticed_within_a_twentieth_of_its_run_time() {
        let ms = Duration::from_millis;
        assert_eq!(poll_pause(Duration::ZERO), Duration::from_micros(250));
        assert_eq!(poll_pause(ms(40)), ms(2));
        assert_eq!(poll_pause(ms(100_000)), ms(20));
        // A command of 30 ms is seen ended by 31.5 ms at the latest.
        let mut t = Duration::ZERO;
        while t < ms(30) {
            t += poll_pause(t);
        }
        assert!(t <= ms(30) + ms(30) / 20, "{t:?}");
    }

    #[test]
    fn nginx_v_paths_resolve_against_the_prefix() {
        let v = "configure arguments: --prefix=/usr/share/nginx --pid-path=/run/nginx.pid \
                 --error-log-path=logs/error.log";
        assert_eq!(
            parse_nginx_v_path(v, "--pid-path="),
            Some(PathBuf::from("/run/nginx.pid"))
        );
        assert_eq!(
            parse_nginx_v_path(v, "--error-log-path="),
            Some(PathBuf::from("/usr/share/nginx/logs/error.log"))
        );
        assert_eq!(parse_nginx_v_path(v, "--http-log-path="), None);
    }

    #[test]
    fn main_level_directive_reads_only_the_main_context_of_the_main_file() {
        let dump = "nginx: the configuration file /x/nginx.conf syntax is ok\n\
                    nginx: configuration file /x/nginx.conf test is successful\n\
                    # configuration file /x/nginx.conf:\n\
                    # pid /commented.pid;\n\
                    user root;\n\
                    http {\n    error_log /http-level.log;\n    server { listen 80; }\n}\n\
                    pid \"/run/my nginx.pid\";\n\
                    error_log /var/log/main.log notice;\n\
                    # configuration file /x/other.conf:\n\
                    pid /other.pid;\n";
        assert_eq!(
            main_level_directive(dump, "pid").as_deref(),
            Some("/run/my nginx.pid")
        );
        assert_eq!(
            main_level_directive(dump, "error_log").as_deref(),
            Some("/var/log/main.log")
        );
        assert_eq!(main_level_directive(dump, "worker_processes"), None);
        assert_eq!(main_level_directive("no dump", "pid"), None);
    }
}
