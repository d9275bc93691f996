//! Typed access to a request's config, the checks against the manifest made before
//! [`Plugin::resolve`](crate::Plugin::resolve), and the root cause of a client error.

use serde_json::Value;

use crate::{ConfigMap, Manifest, ResolveParams, RpcError};

/// The innermost cause under `e` (its last `source()`), as text; `"unknown error"` when it has
/// none. For HTTP clients whose own message carries the URL (which may hold config values).
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e.source();
    let mut last = None;
    while let Some(s) = cur {
        last = Some(s);
        cur = s.source();
    }
    last.map_or_else(|| "unknown error".to_string(), ToString::to_string)
}

/// Typed access to config fields, failing with -32003 and the field's key. Messages never quote
/// the value.
pub trait ConfigExt {
    /// A string that must be set and not empty.
    fn required_str(&self, key: &str) -> Result<&str, RpcError>;
    /// A string that may be absent (`None` also for `null` and `""`).
    fn optional_str(&self, key: &str) -> Result<Option<&str>, RpcError>;
    /// A bool, `default` when absent or `null`.
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, RpcError>;
    /// A number, `None` when absent or `null`.
    fn number(&self, key: &str) -> Result<Option<f64>, RpcError>;
}

impl ConfigExt for ConfigMap {
    fn required_str(&self, key: &str) -> Result<&str, RpcError> {
        match self.optional_str(key)? {
            Some(s) => Ok(s),
            None => Err(RpcError::config(
                key,
                format!("missing required field {key:?}"),
            )),
        }
    }

    fn optional_str(&self, key: &str) -> Result<Option<&str>, RpcError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(RpcError::config(
                key,
                format!("field {key:?} must be a string"),
            )),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, RpcError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(RpcError::config(
                key,
                format!("field {key:?} must be a bool"),
            )),
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, RpcError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(_) => Err(RpcError::config(
                key,
                format!("field {key:?} must be a number"),
            )),
        }
    }
}

/// Checks `params` against the manifest: provider known, required fields set, types right.
pub fn check_params(manifest: &Manifest, params: &ResolveParams) -> Result<(), RpcError> {
    let Some(provider) = manifest.provider(&params.provider) else {
        return Err(RpcError::config(
            "provider",
            format!("unknown provider {:?}", params.provider),
        ));
    };
    for f in &provider.configuration.fields {
        let v = params.config.get(&f.key);
        let unset = matches!(v, None | Some(Value::Null))
            || v.and_then(Value::as_str).is_some_and(str::is_empty);
        if unset {
            if f.required {
                return Err(RpcError::config(
                    &f.key,
                    format!("missing required field {:?}", f.key),
                ));
            }
            continue;
        }
        if let Some(v) = v {
            if !f.field_type.accepts(v) {
                return Err(RpcError::config(
                    &f.key,
                    format!("field {:?} must be a {}", f.key, f.field_type.as_str()),
                ));
            }
        }
    }
    Ok(())
}
