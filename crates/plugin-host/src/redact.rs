//! Redaction of config values from text that leaves the host (errors, captured stderr).

use serde_json::Value;
use tributary_protocol::ConfigMap;

/// Shortest text that is redacted.
pub const MIN_SECRET_LEN: usize = 3;

/// What replaces a config value.
pub const REDACTED: &str = "<redacted>";

/// A set of secret strings; [`Redactor::redact`] replaces every occurrence, longest first.
#[derive(Debug, Default, Clone)]
pub struct Redactor {
    /// Sorted longest first so a value containing another is replaced whole.
    secrets: Vec<String>,
}

impl Redactor {
    /// The values of `config` (see [`ConfigMap::values_as_strings`]), except the JSON literals
    /// `true`/`false`/`null` and texts shorter than [`MIN_SECRET_LEN`]: they carry no secret (a
    /// 2-character value is guessed at once) and would mangle every message.
    pub fn from_config(config: &ConfigMap) -> Self {
        let mut r = Self::default();
        r.add_config(config);
        r
    }

    /// Adds the values of `config`. Returns whether anything new was added.
    pub fn add_config(&mut self, config: &ConfigMap) -> bool {
        let mut added = false;
        for (_, v) in config.iter() {
            if matches!(v, Value::Bool(_) | Value::Null) {
                continue;
            }
            let one: ConfigMap = [("v", v.clone())].into_iter().collect();
            for s in one.values_as_strings() {
                if s.chars().count() >= MIN_SECRET_LEN && !self.secrets.contains(&s) {
                    self.secrets.push(s);
                    added = true;
                }
            }
        }
        if added {
            self.secrets
                .sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        }
        added
    }

    /// `text` with every secret replaced by `<redacted>`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }

    /// Redacts every string inside a JSON value (keys are kept).
    pub fn redact_value(&self, v: &mut Value) {
        match v {
            Value::String(s) => *s = self.redact(s),
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            Value::Object(m) => m.values_mut().for_each(|x| self.redact_value(x)),
            Value::Number(n) if self.secrets.iter().any(|s| *s == n.to_string()) => {
                *v = Value::String(REDACTED.into());
            }
            _ => {}
        }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_longest_first_and_skips_bools() {
        let c: ConfigMap = serde_json::from_str(
            r#"{"a":"tok","b":"tok_live_1","c":true,"d":8500,"e":"x","f":30}"#,
        )
        .unwrap();
        let r = Redactor::from_config(&c);
        assert_eq!(
            r.redact("tok_live_1 and tok at :8500, true, exit 30"),
            "<redacted> and <redacted> at :<redacted>, true, exit 30"
        );
        let mut v = serde_json::json!({"field":"a","detail":["tok", 8500]});
        r.redact_value(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"field":"a","detail":["<redacted>","<redacted>"]})
        );
    }
}
