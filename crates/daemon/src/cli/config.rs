//! `--config` values of `binding add` and `resolve`: KEY=VALUE, KEY=@FILE, KEY=- (standard
//! input), and which fields are secret (never given inline).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};

/// Longest `--config KEY=@FILE` / `KEY=-` value read.
const MAX_CONFIG_VALUE: u64 = 1024 * 1024;

/// Where one `--config` value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ConfigValue {
    /// `KEY=VALUE` (`KEY=@@X` gives the value `@X`).
    Inline(String),
    /// `KEY=@FILE`: the file's text.
    File(PathBuf),
    /// `KEY=-`: standard input's text.
    Stdin,
}

pub(super) fn parse_kv(list: &[String]) -> anyhow::Result<Vec<(String, ConfigValue)>> {
    list.iter()
        .map(|kv| {
            // The argument may be a secret value: never echo it.
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                anyhow!("--config expects KEY=VALUE, KEY=@FILE or KEY=-; one --config argument has no '='")
            })?;
            if k.is_empty() {
                bail!("--config expects KEY=VALUE, got an empty KEY");
            }
            let value = if v == "-" {
                ConfigValue::Stdin
            } else if let Some(rest) = v.strip_prefix("@@") {
                ConfigValue::Inline(format!("@{rest}"))
            } else if let Some(path) = v.strip_prefix('@') {
                if path.is_empty() {
                    bail!("--config {k}=@ names no file: give {k}=@FILE");
                }
                ConfigValue::File(PathBuf::from(path))
            } else {
                ConfigValue::Inline(v.to_string())
            };
            Ok((k.to_string(), value))
        })
        .collect()
}

/// The `--config` values as text: files and stdin read (one final line break dropped), inline
/// values of the fields `is_secret` says are secret refused (they would show in `ps` and in shell
/// history). Errors name the key and the file, never a value.
pub(super) fn read_config(
    list: &[(String, ConfigValue)],
    is_secret: impl Fn(&str) -> bool,
    stdin: &mut dyn std::io::Read,
) -> anyhow::Result<Vec<(String, String)>> {
    use std::io::Read;
    let from_stdin = list
        .iter()
        .filter(|(_, v)| *v == ConfigValue::Stdin)
        .count();
    if from_stdin > 1 {
        bail!("--config KEY=- reads standard input: only one key can be given that way");
    }
    let mut out = Vec::with_capacity(list.len());
    for (k, v) in list {
        let text = match v {
            ConfigValue::Inline(_) if is_secret(k) => bail!(
                "--config {k}: {k:?} is a secret field; a value on the command line shows in `ps` and in shell history: give it as {k}=@FILE (read from a file) or {k}=- (read from standard input)"
            ),
            ConfigValue::Inline(t) => t.clone(),
            ConfigValue::File(path) => {
                let f = std::fs::File::open(path).with_context(|| {
                    format!("--config {k}=@{}: cannot open the file", path.display())
                })?;
                let mut buf = Vec::new();
                f.take(MAX_CONFIG_VALUE + 1)
                    .read_to_end(&mut buf)
                    .with_context(|| {
                        format!("--config {k}=@{}: cannot read the file", path.display())
                    })?;
                config_text(k, buf, &format!("the file {}", path.display()))?
            }
            ConfigValue::Stdin => {
                let mut buf = Vec::new();
                stdin
                    .take(MAX_CONFIG_VALUE + 1)
                    .read_to_end(&mut buf)
                    .with_context(|| format!("--config {k}=-: cannot read standard input"))?;
                config_text(k, buf, "standard input")?
            }
        };
        out.push((k.clone(), text));
    }
    Ok(out)
}

/// A value read for `--config key`: UTF-8, at most [`MAX_CONFIG_VALUE`] bytes, one final `\n`
/// (or `\r\n`) dropped.
fn config_text(key: &str, mut buf: Vec<u8>, from: &str) -> anyhow::Result<String> {
    if buf.len() as u64 > MAX_CONFIG_VALUE {
        bail!("--config {key}: {from} holds more than {MAX_CONFIG_VALUE} bytes");
    }
    if buf.ends_with(b"\n") {
        buf.pop();
        if buf.ends_with(b"\r") {
            buf.pop();
        }
    }
    String::from_utf8(buf).map_err(|_| anyhow!("--config {key}: {from} is not UTF-8 text"))
}

/// The secret field keys of `plugin`'s `provider` in `decls` (none when it is unknown: the daemon
/// or the dry run refuses it with its own error).
pub(super) fn secret_keys(decl: Option<&tributary_protocol::ProviderDecl>) -> Vec<String> {
    decl.map(|d| {
        d.configuration
            .fields
            .iter()
            .filter(|f| f.secret)
            .map(|f| f.key.clone())
            .collect()
    })
    .unwrap_or_default()
}

/// What a binding resolves through, as `binding add` and `resolve` take it.
#[derive(Debug, clap::Args)]
pub(super) struct SourceArgs {
    #[arg(long)]
    pub plugin: String,
    #[arg(long)]
    pub provider: String,
    #[arg(long)]
    pub service: String,
    /// Provider config, KEY=VALUE, KEY=@FILE (the file's text) or KEY=- (standard input)
    /// (repeatable). Secret fields only as @FILE or -, never inline.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    pub config: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_parsing_never_echoes_values() {
        let err = parse_kv(&["s3cr3tvalue".into()]).unwrap_err().to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
        assert_eq!(
            parse_kv(&["a=b=c".into()]).unwrap(),
            vec![("a".to_string(), ConfigValue::Inline("b=c".into()))]
        );
        assert!(parse_kv(&["=v".into()]).is_err());
        assert_eq!(
            parse_kv(&["a=@/f".into(), "b=-".into(), "c=@@x".into()]).unwrap(),
            vec![
                ("a".to_string(), ConfigValue::File("/f".into())),
                ("b".to_string(), ConfigValue::Stdin),
                ("c".to_string(), ConfigValue::Inline("@x".into())),
            ]
        );
        assert!(parse_kv(&["a=@".into()]).is_err());
    }

    fn read(args: &[&str], stdin: &str) -> anyhow::Result<Vec<(String, String)>> {
        let list: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        read_config(&parse_kv(&list)?, |k| k == "token", &mut stdin.as_bytes())
    }

    #[test]
    fn config_values_come_from_files_and_stdin_and_secrets_never_inline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cr3t-from-file\n").unwrap();
        let arg = format!("token=@{}", file.display());
        assert_eq!(
            read(&[&arg, "address=http://a"], "").unwrap(),
            vec![
                ("token".to_string(), "s3cr3t-from-file".to_string()),
                ("address".to_string(), "http://a".to_string())
            ]
        );
        assert_eq!(
            read(&["token=-"], "s3cr3t-from-stdin\r\n").unwrap(),
            vec![("token".to_string(), "s3cr3t-from-stdin".to_string())]
        );
        // A secret field given inline is refused, naming the field and the ways to give it.
        let err = read(&["token=s3cr3t-inline"], "").unwrap_err().to_string();
        assert!(err.contains("\"token\" is a secret field"), "{err}");
        assert!(
            err.contains("token=@FILE") && err.contains("token=-"),
            "{err}"
        );
        assert!(!err.contains("s3cr3t"), "{err}");
        // Two keys from stdin, a missing file, a file too big: clear errors without values.
        let err = read(&["token=-", "address=-"], "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("only one key"), "{err}");
        let err = read(&["token=@/no/such/file"], "").unwrap_err();
        assert!(
            format!("{err:#}").contains("token=@/no/such/file: cannot open"),
            "{err:#}"
        );
        std::fs::write(&file, vec![b'x'; MAX_CONFIG_VALUE as usize + 1]).unwrap();
        let err = read(&[&arg], "").unwrap_err().to_string();
        assert!(err.contains("more than 1048576 bytes"), "{err}");
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        let err = read(&[&arg], "").unwrap_err().to_string();
        assert!(err.contains("not UTF-8"), "{err}");
    }
}
