use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A provider configuration: key → JSON value. Every value is secret.
///
/// Serialises as a plain JSON object. `Debug` shows the keys only (values as `<redacted>`).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConfigMap(BTreeMap<String, Value>);

impl ConfigMap {
    /// An empty configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// The value of `key` when it is a JSON string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    /// Whether `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// Sets `key` to `value`, returning the previous value.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Option<Value> {
        self.0.insert(key.into(), value.into())
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key)
    }

    /// Key/value pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.0.iter()
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every value rendered as text, for redaction: strings as they are, other values as their JSON
    /// text (`8500`, `true`); arrays and objects also contribute each nested scalar. Empty strings
    /// are left out (there is nothing to redact).
    pub fn values_as_strings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for value in self.0.values() {
            collect_strings(value, &mut out);
        }
        out.sort();
        out.dedup();
        out
    }

    /// The underlying map.
    pub fn as_map(&self) -> &BTreeMap<String, Value> {
        &self.0
    }

    /// Consumes the config, giving the underlying map.
    pub fn into_map(self) -> BTreeMap<String, Value> {
        self.0
    }
}

fn collect_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Null => {}
        Value::String(s) => {
            if !s.is_empty() {
                out.push(s.clone());
            }
        }
        Value::Bool(b) => out.push(b.to_string()),
        Value::Number(n) => out.push(n.to_string()),
        Value::Array(items) => {
            out.push(value.to_string());
            for item in items {
                collect_strings(item, out);
            }
        }
        Value::Object(map) => {
            out.push(value.to_string());
            for item in map.values() {
                collect_strings(item, out);
            }
        }
    }
}

impl fmt::Debug for ConfigMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for key in self.0.keys() {
            map.entry(key, &format_args!("<redacted>"));
        }
        map.finish()
    }
}

impl From<BTreeMap<String, Value>> for ConfigMap {
    fn from(map: BTreeMap<String, Value>) -> Self {
        Self(map)
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for ConfigMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl<'a> IntoIterator for &'a ConfigMap {
    type Item = (&'a String, &'a Value);
    type IntoIter = std::collections::btree_map::Iter<'a, String, Value>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_prints_keys_not_values() {
        let mut c = ConfigMap::new();
        c.insert("token", "tok_live_secret");
        c.insert("port", 8500);
        let dbg = format!("{c:?}");
        assert!(dbg.contains("token"), "{dbg}");
        assert!(!dbg.contains("tok_live_secret"), "{dbg}");
        assert!(!dbg.contains("8500"), "{dbg}");
        assert_eq!(dbg, r#"{"port": <redacted>, "token": <redacted>}"#);
    }

    #[test]
    fn values_as_strings_renders_every_value() {
        let c: ConfigMap = serde_json::from_str(
            r#"{"a":"x1","b":8500,"c":true,"d":null,"e":"","f":["y2",{"g":"z3"}]}"#,
        )
        .unwrap();
        let v = c.values_as_strings();
        for want in ["x1", "8500", "true", "y2", "z3"] {
            assert!(v.iter().any(|s| s == want), "{want} missing from {v:?}");
        }
        assert!(!v.iter().any(String::is_empty));
    }

    #[test]
    fn serialises_transparently() {
        let mut c = ConfigMap::new();
        c.insert("address", "https://r:8500");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"address":"https://r:8500"}"#
        );
        assert_eq!(c.get_str("address"), Some("https://r:8500"));
        assert_eq!(c.iter().count(), 1);
    }
}
