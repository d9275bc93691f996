//! What a provider declares: its configuration form (fields and their types), and which stored
//! secrets a new configuration may keep ([`ProviderDecl::carry_secrets`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Type of a configuration field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// Text (the default).
    #[default]
    String,
    /// A checkbox: JSON `true`/`false`.
    Bool,
    /// A JSON number.
    Number,
}

impl FieldType {
    /// Whether `value` has this type.
    pub fn accepts(self, value: &Value) -> bool {
        match self {
            FieldType::String => value.is_string(),
            FieldType::Bool => value.is_boolean(),
            FieldType::Number => value.is_number(),
        }
    }

    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldType::String => "string",
            FieldType::Bool => "bool",
            FieldType::Number => "number",
        }
    }
}

/// One field of a provider's configuration form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldDecl {
    pub key: String,
    pub display_name: String,
    #[serde(default)]
    pub required: bool,
    /// Write-only in the API and UI (shown as set/unset). Every value is still treated as secret.
    #[serde(default)]
    pub secret: bool,
    /// The field says where the plugin connects (an address, endpoints, a region...): a stored
    /// secret is only sent again with the endpoint it was saved with (see
    /// [`ProviderDecl::carry_secrets`]). A field cannot be both `secret` and `endpoint`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub endpoint: bool,
    #[serde(rename = "type", default)]
    pub field_type: FieldType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// `configuration` of a provider.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Configuration {
    #[serde(default)]
    pub fields: Vec<FieldDecl>,
}

/// A provider offered by a discovery plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderDecl {
    pub code: String,
    pub name: String,
    #[serde(default)]
    pub configuration: Configuration,
}

/// Why stored secrets cannot be kept for a new configuration ([`ProviderDecl::carry_secrets`]).
/// Names fields only, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SecretNotResent {
    /// The first secret field that must be given again.
    pub secret: String,
    /// Every secret field left out that must be given again (`secret` first), in declaration
    /// order.
    pub secrets: Vec<String>,
    /// The endpoint field whose value changed.
    pub endpoint: String,
    /// The provider marks no field `endpoint`: `endpoint` is a plain field, taken as one.
    pub implied: bool,
}

impl std::fmt::Display for SecretNotResent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list: Vec<String> = self.secrets.iter().map(|s| format!("{s:?}")).collect();
        let list = list.join(", ");
        let endpoint = &self.endpoint;
        if self.secrets.len() > 1 {
            write!(
                f,
                "fields {list} are secret and were saved for another {endpoint:?}: give {list} again to send them to the new {endpoint:?}"
            )?;
        } else {
            write!(
                f,
                "field {list} is secret and was saved for another {endpoint:?}: give {list} again to send it to the new {endpoint:?}"
            )?;
        }
        f.write_str(" (a stored secret is only sent to the endpoint it was saved with")?;
        if self.implied {
            f.write_str("; this provider marks no field `endpoint`, so every field that is not secret counts as one")?;
        }
        f.write_str(")")
    }
}

impl ProviderDecl {
    /// The field declared with `key`.
    pub fn field(&self, key: &str) -> Option<&FieldDecl> {
        self.configuration.fields.iter().find(|f| f.key == key)
    }

    /// Keeps the stored values of secret fields that `input` leaves out (a form does not send
    /// secrets back), copying them from `previous` (the saved configuration of the same provider),
    /// unless a field marked `endpoint` differs between `previous` and `input`: a stored secret is
    /// never sent to an endpoint it was not saved with. A provider that marks no field `endpoint`
    /// (a plugin whose author did not think of it) has every non-secret field taken as one. Then
    /// every secret field left out is named in the error (the person must give them again).
    /// Absent, `null` and blank values are the same; text and numbers compare by their trimmed
    /// text.
    pub fn carry_secrets(
        &self,
        previous: &crate::ConfigMap,
        input: &mut crate::ConfigMap,
    ) -> Result<(), SecretNotResent> {
        let fields = &self.configuration.fields;
        let missing: Vec<&FieldDecl> = fields
            .iter()
            .filter(|f| f.secret && !input.contains_key(&f.key) && previous.contains_key(&f.key))
            .collect();
        let Some(first) = missing.first() else {
            return Ok(());
        };
        let implied = !fields.iter().any(|f| f.endpoint);
        let is_endpoint = |f: &FieldDecl| f.endpoint || (implied && !f.secret);
        let changed = fields.iter().find(|f| {
            is_endpoint(f) && comparable(previous.get(&f.key)) != comparable(input.get(&f.key))
        });
        if let Some(endpoint) = changed {
            return Err(SecretNotResent {
                secret: first.key.clone(),
                secrets: missing.iter().map(|f| f.key.clone()).collect(),
                endpoint: endpoint.key.clone(),
                implied,
            });
        }
        for f in missing {
            if let Some(v) = previous.get(&f.key) {
                input.insert(f.key.clone(), v.clone());
            }
        }
        Ok(())
    }
}

/// A config value as compared by [`ProviderDecl::carry_secrets`]: `None` for absent, `null` and
/// blank text; numbers and text by their trimmed text.
fn comparable(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Null => None,
        Value::String(s) if s.trim().is_empty() => None,
        Value::String(s) => Some(s.trim().to_string()),
        other => Some(other.to_string()),
    }
}
