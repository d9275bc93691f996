//! `tributary serve`'s configuration file (reference: `docs/cli.md`, "Configuration file").
//!
//! The file is TOML; each key is a long option of `serve` in snake_case (`data_dir` for
//! `--data-dir`) and its value a string or an integer. The file is turned into options inserted
//! right after `serve`, before the ones given on the command line; the `serve` command is built
//! with `args_override_self`, so an option given on the command line overrides the file's value.
//! Which file: `--config-file PATH` (it must exist), else [`DEFAULT_CONFIG_FILE`] when it exists,
//! else none. A key that is not a `serve` option, a value of another type or a value the option
//! refuses is an error naming the file and the key; nothing starts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

/// The file read when `--config-file` is not given and it exists (the Debian package installs it).
pub const DEFAULT_CONFIG_FILE: &str = "/etc/tributary/tributary.toml";
/// The option naming the file (a `serve` option; it cannot be set in the file).
pub const CONFIG_FILE_OPTION: &str = "config-file";

/// `args` (a whole command line, program name first) with the settings of `serve`'s configuration
/// file inserted right after `serve`. Command lines of other subcommands, and `serve --help`, are
/// returned unchanged. `cli` is the command definition (`Cli::command()`).
pub fn expand_args(args: Vec<OsString>, cli: &clap::Command) -> anyhow::Result<Vec<OsString>> {
    expand_args_with_default(args, cli, Path::new(DEFAULT_CONFIG_FILE))
}

fn expand_args_with_default(
    args: Vec<OsString>,
    cli: &clap::Command,
    default: &Path,
) -> anyhow::Result<Vec<OsString>> {
    if args.get(1).and_then(|a| a.to_str()) != Some("serve") {
        return Ok(args);
    }
    let rest = &args[2..];
    if rest.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(args);
    }
    let file = match explicit_file(rest)? {
        Some(f) => f,
        None if default.is_file() => default.to_path_buf(),
        None => return Ok(args),
    };
    let serve = cli
        .find_subcommand("serve")
        .ok_or_else(|| anyhow!("the command line has no `serve` subcommand"))?;
    let from_file = file_args(&file, serve)?;
    let mut out = args[..2].to_vec();
    out.extend(from_file);
    out.extend(rest.iter().cloned());
    Ok(out)
}

/// The value of `--config-file PATH` / `--config-file=PATH` (the last one wins, like any option).
fn explicit_file(rest: &[OsString]) -> anyhow::Result<Option<PathBuf>> {
    let long = format!("--{CONFIG_FILE_OPTION}");
    let mut found = None;
    let mut i = 0;
    while i < rest.len() {
        let a = rest[i].to_string_lossy();
        if a == "--" {
            break;
        }
        if a == long {
            let v = rest
                .get(i + 1)
                .ok_or_else(|| anyhow!("{long} needs a file path"))?;
            found = Some(PathBuf::from(v));
            i += 1;
        } else if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            found = Some(PathBuf::from(v));
        }
        i += 1;
    }
    if let Some(f) = &found {
        if f.as_os_str().is_empty() {
            bail!("{long} needs a file path, got an empty one");
        }
    }
    Ok(found)
}

/// Reads `file` and returns its settings as `serve` options, each checked against the option.
fn file_args(file: &Path, serve: &clap::Command) -> anyhow::Result<Vec<OsString>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the configuration file {}", file.display()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("{}: not valid TOML: {e}", file.display()))?;
    let known = known_keys(serve);
    let mut out = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != CONFIG_FILE_OPTION)
            .filter(|_| !key.contains('-'))
            .ok_or_else(|| {
                anyhow!(
                    "{}: unknown setting `{key}` (settings: {})",
                    file.display(),
                    known.join(", ")
                )
            })?;
        let takes_value = arg.get_action().takes_values();
        let one = match (value, takes_value) {
            (toml::Value::String(s), true) => vec![format!("--{long}"), s.clone()],
            (toml::Value::Integer(n), true) => vec![format!("--{long}"), n.to_string()],
            (toml::Value::Boolean(true), false) => vec![format!("--{long}")],
            (toml::Value::Boolean(false), false) => vec![],
            (_, true) => bail!(
                "{}: setting `{key}` must be a string or an integer",
                file.display()
            ),
            (_, false) => bail!("{}: setting `{key}` must be true or false", file.display()),
        };
        // Check the value with the option's own parser, so the error names the file and the key.
        let mut probe = vec![OsString::from("serve")];
        probe.extend(one.iter().map(OsString::from));
        if let Err(e) = serve.clone().try_get_matches_from(probe) {
            let why = e.to_string();
            let why = why
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            bail!("{}: setting `{key}`: {why}", file.display());
        }
        out.extend(one.into_iter().map(OsString::from));
    }
    Ok(out)
}

/// The keys a configuration file may hold: `serve`'s long options in snake_case.
fn known_keys(serve: &clap::Command) -> Vec<String> {
    serve
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| *l != CONFIG_FILE_OPTION && *l != "help")
        .map(|l| l.replace('-', "_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn cli() -> Command {
        Command::new("tributary").subcommand(
            Command::new("serve")
                .args_override_self(true)
                .arg(
                    Arg::new("listen")
                        .long("listen")
                        .value_parser(clap::value_parser!(std::net::SocketAddr)),
                )
                .arg(
                    Arg::new("history")
                        .long("history")
                        .value_parser(clap::value_parser!(usize)),
                )
                .arg(Arg::new("data_dir").long("data-dir"))
                .arg(
                    Arg::new("verbose")
                        .long("verbose")
                        .action(ArgAction::SetTrue),
                )
                .arg(Arg::new("config_file").long(CONFIG_FILE_OPTION)),
        )
    }

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn no_default() -> PathBuf {
        PathBuf::from("/nonexistent/tributary.toml")
    }

    #[test]
    fn file_settings_come_first_and_the_command_line_overrides_them() {
        let f = file(
            "listen = \"127.0.0.1:9999\"\nhistory = 5\ndata_dir = \"/var/lib/x\"\nverbose = true\n",
        );
        let p = f.path().to_str().unwrap();
        let out = expand_args_with_default(
            args(&["tributary", "serve", "--config-file", p, "--history", "7"]),
            &cli(),
            &no_default(),
        )
        .unwrap();
        let out = strings(out);
        assert_eq!(&out[..2], ["tributary", "serve"]);
        assert!(out.ends_with(&[
            "--config-file".into(),
            p.into(),
            "--history".into(),
            "7".into()
        ]));
        let m = cli().try_get_matches_from(&out).unwrap();
        let m = m.subcommand_matches("serve").unwrap();
        assert_eq!(m.get_one::<usize>("history"), Some(&7), "the flag wins");
        assert_eq!(
            m.get_one::<std::net::SocketAddr>("listen")
                .unwrap()
                .to_string(),
            "127.0.0.1:9999"
        );
        assert_eq!(m.get_one::<String>("data_dir").unwrap(), "/var/lib/x");
        assert!(m.get_flag("verbose"));
    }

    #[test]
    fn the_default_file_is_read_only_when_it_exists() {
        let f = file("history = 3\n");
        let out =
            expand_args_with_default(args(&["tributary", "serve"]), &cli(), f.path()).unwrap();
        assert_eq!(strings(out), ["tributary", "serve", "--history", "3"]);
        let out =
            expand_args_with_default(args(&["tributary", "serve"]), &cli(), &no_default()).unwrap();
        assert_eq!(strings(out), ["tributary", "serve"]);
    }

    #[test]
    fn other_subcommands_and_help_are_untouched() {
        let f = file("history = 3\n");
        for a in [
            &["tributary", "binding", "list"][..],
            &["tributary", "serve", "--help"],
        ] {
            let out = expand_args_with_default(args(a), &cli(), f.path()).unwrap();
            assert_eq!(strings(out), a);
        }
    }

    #[test]
    fn an_explicit_file_must_exist() {
        let err = expand_args_with_default(
            args(&["tributary", "serve", "--config-file=/nonexistent/x.toml"]),
            &cli(),
            &no_default(),
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/x.toml"),
            "{err:#}"
        );
        let err = expand_args_with_default(
            args(&["tributary", "serve", "--config-file"]),
            &cli(),
            &no_default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("needs a file path"), "{err}");
    }

    #[test]
    fn bad_settings_name_the_file_and_the_key() {
        let cases = [
            ("colour = \"red\"\n", "unknown setting `colour`"),
            ("data-dir = \"/x\"\n", "unknown setting `data-dir`"),
            ("config_file = \"/x\"\n", "unknown setting `config_file`"),
            (
                "history = \"many\"\n",
                "setting `history`: invalid value 'many'",
            ),
            ("listen = 80\n", "setting `listen`: invalid value '80'"),
            (
                "history = [1]\n",
                "setting `history` must be a string or an integer",
            ),
            (
                "verbose = \"yes\"\n",
                "setting `verbose` must be true or false",
            ),
            ("history = \n", "not valid TOML"),
        ];
        for (text, want) in cases {
            let f = file(text);
            let err = expand_args_with_default(
                args(&[
                    "tributary",
                    "serve",
                    "--config-file",
                    f.path().to_str().unwrap(),
                ]),
                &cli(),
                &no_default(),
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(err.contains(f.path().to_str().unwrap()), "{text:?}: {err}");
        }
    }

    #[test]
    fn unknown_keys_list_the_known_ones() {
        let f = file("colour = 1\n");
        let err = file_args(f.path(), cli().find_subcommand("serve").unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen, history, data_dir, verbose"), "{err}");
    }
}
