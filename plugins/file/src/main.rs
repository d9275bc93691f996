//! The `file` discovery plugin: provider `file` reads a JSON or YAML file mapping each service to
//! its servers, on every resolution (so editing the file is how the registry changes).
//!
//! ```yaml
//! api:
//!   - 10.0.1.12:8080                # address:port[:weight], IPv6 as [addr]:port[:weight]
//!   - address: 10.0.2.7             # or an object
//!     port: 8080
//!     weight: 2                     # optional, 1-1000 (0 means 1)
//!     tags: [zone-b, canary]        # optional, for display
//! idle: []                          # a known service without servers right now
//! ```
//!
//! Config: `path` (required). Errors: the file cannot be read, is too big or is not a mapping of
//! service → list of servers, or an entry is malformed → -32003 `path` (the entry is named by
//! service and position, never by its text); a service not in the file → -32003 `service`.
//! Messages never contain the path (every config value is secret).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tributary_base::lock;
use tributary_plugin_sdk::{
    parse_port, parse_weight, split_target, target, weight_value, ConfigExt, Plugin, ResolveParams,
    ResolveResult, RpcError,
};

/// Files over this size are refused (a registry file is a few KiB; this guards the plugin's memory).
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The last file parsed, reused while its identity (device, inode, size, mtime, ctime) is the same:
/// any write or replacement of the file changes it (see [`load_cached`] for writes close together).
type Cache = Mutex<Option<(FileKey, Arc<Map<String, Value>>)>>;

#[derive(Clone, PartialEq, Eq)]
struct FileKey {
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

#[derive(Default)]
struct FilePlugin {
    cache: Cache,
}

impl Plugin for FilePlugin {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        resolve(&params, &self.cache)
    }
}

fn resolve(params: &ResolveParams, cache: &Cache) -> Result<ResolveResult, RpcError> {
    let path = Path::new(params.config.required_str("path")?);
    let services = load_cached(path, cache)?;
    let Some(entries) = services.get(&params.service) else {
        return Err(RpcError::config(
            "service",
            format!("unknown service {:?}: not in the file", params.service),
        ));
    };
    let targets = parse_targets(&params.service, entries)?;
    Ok(ResolveResult {
        targets,
        ttl_seconds: 0,
    })
}

fn path_error(why: impl std::fmt::Display) -> RpcError {
    RpcError::config("path", format!("the services file {why}"))
}

/// [`load`], or the cached mapping when the file is the same as last time.
fn load_cached(path: &Path, cache: &Cache) -> Result<Arc<Map<String, Value>>, RpcError> {
    let meta = std::fs::metadata(path).map_err(|e| path_error(format!("cannot be read: {e}")))?;
    let key = FileKey {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
    };
    if let Some((k, map)) = lock(cache).as_ref() {
        if *k == key {
            return Ok(map.clone());
        }
    }
    let map = Arc::new(load(path, &meta)?);
    // File times tick coarsely (a few ms): two writes of the same size within one tick leave the
    // same key. So a file is cached only once its last change is old enough that a later write must
    // show a new time ("racy" entries are re-read every time, as git does with its index).
    let newest = key.mtime.max(key.ctime);
    let now = tributary_base::now_ms() / 1000;
    if now - newest.0 >= 2 {
        *lock(cache) = Some((key, map.clone()));
    }
    Ok(map)
}

/// Reads and parses the file into its top-level mapping. JSON for a `.json` name, YAML otherwise
/// (YAML also reads JSON).
fn load(path: &Path, meta: &std::fs::Metadata) -> Result<Map<String, Value>, RpcError> {
    if !meta.is_file() {
        return Err(path_error("is not a regular file"));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(path_error(format!(
            "is {} bytes, over the limit of {MAX_FILE_BYTES}",
            meta.len()
        )));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| path_error(format!("cannot be read: {e}")))?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let doc: Value = if is_json {
        serde_json::from_str(&text).map_err(|e| path_error(format!("is not valid JSON: {e}")))?
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| path_error(format!("is not valid YAML: {e}")))?
    };
    match doc {
        Value::Object(map) => Ok(map),
        Value::Null => Err(path_error(
            "is empty (expected a mapping of service to servers)",
        )),
        _ => Err(path_error(
            "must hold a mapping of service name to a list of servers",
        )),
    }
}

fn parse_targets(service: &str, entries: &Value) -> Result<Vec<Value>, RpcError> {
    let list = match entries {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) => list,
        _ => {
            return Err(path_error(format!(
                "has service {service:?} without a list of servers"
            )))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            parse_entry(entry).map_err(|why| {
                path_error(format!(
                    "has a bad server: {service:?} entry {}: {why}",
                    i + 1
                ))
            })
        })
        .collect()
}

fn parse_entry(entry: &Value) -> Result<Value, String> {
    match entry {
        Value::String(s) => parse_text_entry(s.trim()).map_err(str::to_string),
        Value::Object(o) => parse_object_entry(o),
        _ => Err("expected \"address:port[:weight]\" or {address, port, weight, tags}".into()),
    }
}

fn parse_object_entry(o: &Map<String, Value>) -> Result<Value, String> {
    if let Some(k) = o
        .keys()
        .find(|k| !matches!(k.as_str(), "address" | "port" | "weight" | "tags"))
    {
        return Err(format!(
            "unknown key {k:?} (known: address, port, weight, tags)"
        ));
    }
    let address = match o.get("address") {
        Some(Value::String(a)) if valid_address_text(a) => a.as_str(),
        Some(Value::String(_)) => {
            return Err("address must be an IP address or host name without port or spaces".into())
        }
        Some(_) => return Err("address must be a string".into()),
        None => return Err("address is missing".into()),
    };
    let port = match o.get("port") {
        Some(p) => p
            .as_u64()
            .filter(|p| (1..=65535).contains(p))
            .ok_or("port must be a whole number from 1 to 65535")? as u16,
        None => return Err("port is missing".into()),
    };
    let mut t = target(address, port, weight_value(o.get("weight"))?);
    match o.get("tags") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tags)) if tags.iter().all(Value::is_string) => {
            t["tags"] = Value::Array(tags.clone());
        }
        Some(_) => return Err("tags must be a list of strings".into()),
    }
    Ok(t)
}

fn valid_address_text(a: &str) -> bool {
    !a.is_empty() && !a.contains(|c: char| c.is_whitespace() || c == '/' || c == '[' || c == ']')
}

/// `address:port[:weight]`, IPv6 as `[addr]:port[:weight]`.
fn parse_text_entry(entry: &str) -> Result<Value, &'static str> {
    let t = split_target(entry)?;
    if !valid_address_text(t.address) {
        return Err("address must be an IP address or host name without spaces");
    }
    let port = parse_port(t.port)?;
    let weight = t.weight.map(parse_weight).transpose()?.flatten();
    Ok(target(t.address, port, weight))
}

fn main() -> ExitCode {
    tributary_plugin_sdk::run(FilePlugin::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tributary_plugin_sdk::{ConfigMap, ERR_CONFIG};

    fn resolve(params: &ResolveParams) -> Result<ResolveResult, RpcError> {
        super::resolve(params, &Cache::default())
    }

    fn params(path: &Path, service: &str) -> ResolveParams {
        ResolveParams {
            provider: "file".into(),
            config: serde_json::from_value::<ConfigMap>(json!({"path": path})).unwrap(),
            service: service.into(),
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn yaml_and_json_files_resolve_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = write(
            dir.path(),
            "s.yaml",
            "api:\n  - 10.0.0.1:80\n  - {address: 10.0.0.2, port: 8080, weight: 2, tags: [a]}\n  - '[2001:db8::1]:443:7'\n  - web.local:81:0\nidle: []\nnothing:\n",
        );
        let json = write(
            dir.path(),
            "s.json",
            r#"{"api":["10.0.0.1:80",{"address":"10.0.0.2","port":8080,"weight":2,"tags":["a"]},"[2001:db8::1]:443:7","web.local:81:0"],"idle":[],"nothing":null}"#,
        );
        let expected = vec![
            json!({"address":"10.0.0.1","port":80}),
            json!({"address":"10.0.0.2","port":8080,"weight":2,"tags":["a"]}),
            json!({"address":"2001:db8::1","port":443,"weight":7}),
            json!({"address":"web.local","port":81}),
        ];
        for p in [&yaml, &json] {
            let r = resolve(&params(p, "api")).unwrap();
            assert_eq!(r.targets, expected, "{}", p.display());
            assert_eq!(r.ttl_seconds, 0);
            assert!(resolve(&params(p, "idle")).unwrap().targets.is_empty());
            assert!(resolve(&params(p, "nothing")).unwrap().targets.is_empty());
            let e = resolve(&params(p, "db")).unwrap_err();
            assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("service")));
        }
    }

    #[test]
    fn unreadable_or_invalid_files_name_path_and_never_quote_it() {
        let dir = tempfile::tempdir().unwrap();
        let secret_dir = dir.path().join("s3cr3t-folder");
        std::fs::create_dir(&secret_dir).unwrap();
        let cases = [
            (secret_dir.join("missing.yaml"), "cannot be read"),
            (secret_dir.clone(), "not a regular file"),
            (
                write(&secret_dir, "bad.json", "{\"api\": ["),
                "not valid JSON",
            ),
            (
                write(&secret_dir, "bad.yaml", "api: [\n  - : :\n"),
                "not valid YAML",
            ),
            (write(&secret_dir, "list.yaml", "- 1.2.3.4:80\n"), "mapping"),
            (write(&secret_dir, "empty.yaml", ""), "is empty"),
            (
                write(&secret_dir, "scalar.yaml", "api: 1.2.3.4:80\n"),
                "without a list",
            ),
            (
                write(&secret_dir, "port.yaml", "api: ['1.2.3.4:0']\n"),
                "entry 1: port",
            ),
            (
                write(
                    &secret_dir,
                    "weight.yaml",
                    "api: [1.2.3.4:80, {address: a, port: 1, weight: 1001}]\n",
                ),
                "entry 2: weight",
            ),
            (
                write(
                    &secret_dir,
                    "key.yaml",
                    "api: [{address: a, port: 1, wieght: 2}]\n",
                ),
                "unknown key \"wieght\"",
            ),
            (
                write(&secret_dir, "noport.yaml", "api: [{address: a}]\n"),
                "port is missing",
            ),
            (
                write(&secret_dir, "v6.yaml", "api: ['2001:db8::1:80']\n"),
                "too many",
            ),
            (
                write(
                    &secret_dir,
                    "addr.yaml",
                    "api: [{address: 'a b', port: 1}]\n",
                ),
                "address must be",
            ),
            (write(&secret_dir, "num.yaml", "api: [42]\n"), "expected"),
        ];
        for (path, why) in cases {
            let e = resolve(&params(&path, "api")).unwrap_err();
            assert_eq!(e.code, ERR_CONFIG, "{}: {}", path.display(), e.message);
            assert_eq!(e.field(), Some("path"), "{}: {}", path.display(), e.message);
            assert!(e.message.contains(why), "{}: {}", path.display(), e.message);
            assert!(!e.message.contains("s3cr3t"), "path leaked: {}", e.message);
        }
    }

    #[test]
    fn the_cache_sees_every_change_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::default();
        let p = write(dir.path(), "s.yaml", "api: ['10.0.0.1:80']\n");
        let first = super::resolve(&params(&p, "api"), &cache).unwrap();
        assert_eq!(first.targets, vec![json!({"address":"10.0.0.1","port":80})]);
        assert!(
            cache.lock().unwrap().is_none(),
            "a file changed just now is not cached"
        );
        std::thread::sleep(std::time::Duration::from_millis(2100));
        super::resolve(&params(&p, "api"), &cache).unwrap();
        assert!(cache.lock().unwrap().is_some(), "an older file is cached");
        // Same size, rewritten in place: the change time moves, the cached copy is not used.
        std::fs::write(&p, "api: ['10.0.0.2:80']\n").unwrap();
        let second = super::resolve(&params(&p, "api"), &cache).unwrap();
        assert_eq!(
            second.targets,
            vec![json!({"address":"10.0.0.2","port":80})]
        );
        // Replaced by rename (how editors and config tools write).
        let tmp = write(dir.path(), "new.yaml", "api: ['10.0.0.3:80']\n");
        std::fs::rename(&tmp, &p).unwrap();
        let third = super::resolve(&params(&p, "api"), &cache).unwrap();
        assert_eq!(third.targets, vec![json!({"address":"10.0.0.3","port":80})]);
        std::fs::remove_file(&p).unwrap();
        let e = super::resolve(&params(&p, "api"), &cache).unwrap_err();
        assert_eq!(e.field(), Some("path"));
    }

    #[test]
    fn missing_path_is_reported_as_path() {
        let p = ResolveParams {
            provider: "file".into(),
            config: ConfigMap::new(),
            service: "api".into(),
        };
        let e = resolve(&p).unwrap_err();
        assert_eq!(e.field(), Some("path"));
    }

    #[test]
    fn own_manifest_is_valid() {
        let m = tributary_plugin_sdk::Manifest::parse(include_str!("../plugin.json")).unwrap();
        assert_eq!(m.name, "file");
        assert!(m.provider("file").unwrap().field("path").unwrap().required);
    }
}
