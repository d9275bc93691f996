//! Reading a plugins directory: each folder's manifest and executable, and the environment its
//! process will get. Starts no process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use tributary_protocol::Manifest;

use crate::supervise::{Slot, SlotState, StderrLog};
use crate::{HostOptions, LoadError, PluginHost, Redactor, MANIFEST_FILE};

/// A loaded plugin. Serialises as `{name, version, description, dir, manifest}`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    /// The plugin's folder.
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl PluginHost {
    /// Reads every folder of `plugins_dir` (hidden ones excepted). Refused folders are returned as
    /// errors; the host holds the others. Starts no process.
    pub fn load(plugins_dir: &Path, opts: HostOptions) -> (PluginHost, Vec<LoadError>) {
        let mut errors = Vec::new();
        let mut slots: BTreeMap<String, Arc<Slot>> = BTreeMap::new();
        let mut dirs = Vec::new();
        match std::fs::read_dir(plugins_dir) {
            Ok(rd) => {
                for entry in rd.flatten() {
                    let path = entry.path();
                    let hidden = entry.file_name().to_string_lossy().starts_with('.');
                    if path.is_dir() && !hidden {
                        dirs.push(path);
                    }
                }
            }
            Err(source) => errors.push(LoadError::ReadDir {
                dir: plugins_dir.to_path_buf(),
                source,
            }),
        }
        dirs.sort();
        let (home_root, home_tmp) = match &opts.home_root {
            Some(r) => (r.clone(), None),
            None => match tempfile::Builder::new()
                .prefix("tributary-plugin-homes-")
                .tempdir()
            {
                Ok(t) => (t.path().to_path_buf(), Some(t)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a temporary folder for plugin homes");
                    (std::env::temp_dir().join("tributary-plugin-homes"), None)
                }
            },
        };
        for dir in dirs {
            match load_one(&dir) {
                Ok((info, exe)) => {
                    if let Some(first) = slots.get(&info.name) {
                        errors.push(LoadError::DuplicateName {
                            dir,
                            name: info.name.clone(),
                            first: first.info.dir.clone(),
                        });
                        continue;
                    }
                    let slot = Slot {
                        env: plugin_environment(&info.manifest.environment, std::env::vars_os()),
                        home: home_root.join(&info.name),
                        calls: tokio::sync::Semaphore::new(opts.max_concurrent.max(1)),
                        info,
                        exe,
                        state: Mutex::new(SlotState::default()),
                        secrets: Mutex::new(Redactor::default()),
                        stderr: Mutex::new(StderrLog {
                            lines: Default::default(),
                            cap: opts.stderr_lines,
                        }),
                    };
                    slots.insert(slot.info.name.clone(), Arc::new(slot));
                }
                Err(e) => errors.push(e),
            }
        }
        for e in &errors {
            tracing::warn!("plugin refused: {e}");
        }
        let host = PluginHost {
            slots,
            opts,
            _home_tmp: home_tmp,
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        };
        (host, errors)
    }
}

fn load_one(dir: &Path) -> Result<(PluginInfo, PathBuf), LoadError> {
    let mpath = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&mpath) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LoadError::NoManifest {
                dir: dir.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(LoadError::ReadManifest {
                dir: dir.to_path_buf(),
                source,
            })
        }
    };
    let manifest = Manifest::parse(&text).map_err(|source| LoadError::Manifest {
        dir: dir.to_path_buf(),
        source,
    })?;
    let exe = executable_path(dir, &manifest)?;
    let info = PluginInfo {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        description: manifest.description.clone(),
        dir: dir.to_path_buf(),
        manifest,
    };
    Ok((info, exe))
}

/// The manifest's executable, resolved against the plugin folder and made absolute, checked to be an
/// executable file.
pub fn executable_path(dir: &Path, manifest: &Manifest) -> Result<PathBuf, LoadError> {
    use std::os::unix::fs::PermissionsExt;
    // Absolute: the process starts with the plugin folder as working directory, where a path
    // relative to ours would point elsewhere.
    let joined = dir.join(&manifest.executable);
    let path = std::path::absolute(&joined).unwrap_or(joined);
    match std::fs::metadata(&path) {
        Err(_) => Err(LoadError::MissingExecutable {
            dir: dir.to_path_buf(),
            path,
        }),
        Ok(m) if !m.is_file() || m.permissions().mode() & 0o111 == 0 => {
            Err(LoadError::NotExecutable {
                dir: dir.to_path_buf(),
                path,
            })
        }
        Ok(_) => Ok(path),
    }
}

/// The environment of a plugin process: `PATH` (the daemon's, else `/usr/local/bin:/usr/bin:/bin`),
/// `LANG` (the daemon's, else `C.UTF-8`), `TZ` (the daemon's, when set) and the daemon's variables
/// the manifest's `environment` lets through (never `TRIBUTARY_*`). `HOME` is added at start.
pub(crate) fn plugin_environment(
    declared: &[String],
    daemon: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    use std::ffi::OsString;
    let mut base: BTreeMap<String, OsString> = BTreeMap::new();
    base.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    base.insert("LANG".into(), "C.UTF-8".into());
    let mut passed = Vec::new();
    for (k, v) in daemon {
        let Some(name) = k.to_str() else { continue };
        match name {
            "PATH" | "LANG" | "TZ" => {
                base.insert(name.to_string(), v);
            }
            "HOME" => {}
            _ if tributary_protocol::environment_allows(declared, name) => passed.push((k, v)),
            _ => {}
        }
    }
    base.into_iter()
        .map(|(k, v)| (OsString::from(k), v))
        .chain(passed)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_environment_is_the_clean_base_and_the_declared_variables() {
        let daemon = [
            ("PATH", "/opt/bin:/usr/bin"),
            ("HOME", "/root"),
            ("TZ", "Europe/Paris"),
            ("TRIBUTARY_TOKEN", "tok"),
            ("TRIBUTARY_UI_PASSWORD", "pw"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("CONSUL_CACERT", "/ca.pem"),
            ("RUST_LOG", "debug"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let declared = vec!["AWS_*".to_string(), "CONSUL_CACERT".to_string()];
        let env = plugin_environment(&declared, daemon.clone().into_iter());
        let env: BTreeMap<String, String> = env
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        let want: BTreeMap<String, String> = [
            ("PATH", "/opt/bin:/usr/bin"),
            ("LANG", "C.UTF-8"),
            ("TZ", "Europe/Paris"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("CONSUL_CACERT", "/ca.pem"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect();
        assert_eq!(env, want);
        // Nothing declared: the base only; no TZ when the daemon has none.
        let env = plugin_environment(&[], std::iter::empty());
        let keys: Vec<_> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(keys, ["LANG", "PATH"]);
    }
}
