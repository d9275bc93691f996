//! A binding: an upstream name bound to a plugin's provider, its config, a service, an interval
//! and extra directives. Validated when saved.

use std::time::Duration;

use serde_json::Value;
use tributary_protocol::{ConfigMap, FieldType, ProviderDecl};

use crate::schedule::MIN_INTERVAL;
use crate::{ExtraDirective, UpstreamName};

/// Everything the engine needs to resolve and write one upstream. `Debug` never shows config
/// values (see [`ConfigMap`]); there is deliberately no `Serialize`, so a binding cannot be sent
/// out with its secrets by accident.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    pub name: UpstreamName,
    pub plugin: String,
    pub provider: String,
    pub config: ConfigMap,
    pub service: String,
    pub interval: Duration,
    pub directives: Vec<ExtraDirective>,
}

/// Why a binding cannot be saved. Texts name the field at fault and never contain a config value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("plugin is empty")]
    EmptyPlugin,
    #[error("provider is empty")]
    EmptyProvider,
    #[error("service is empty")]
    EmptyService,
    #[error("service contains a control character")]
    ServiceControlChar,
    #[error("interval {seconds} s is below the minimum of {} s", MIN_INTERVAL.as_secs())]
    IntervalTooShort { seconds: u64 },
    #[error("the declaration is for provider {declared:?}, the binding uses {used:?}")]
    ProviderMismatch { declared: String, used: String },
    #[error("config field {key:?} is required")]
    MissingField { key: String },
    #[error("config field {key:?} is not declared by the provider")]
    UnknownField { key: String },
    #[error("config field {key:?} must be a {expected}")]
    WrongType { key: String, expected: &'static str },
}

impl BindingError {
    /// The field at fault, for API errors: a config key, `"service"`, `"interval"`, `"plugin"` or
    /// `"provider"`.
    pub fn field(&self) -> &str {
        match self {
            BindingError::EmptyPlugin => "plugin",
            BindingError::EmptyProvider | BindingError::ProviderMismatch { .. } => "provider",
            BindingError::EmptyService | BindingError::ServiceControlChar => "service",
            BindingError::IntervalTooShort { .. } => "interval",
            BindingError::MissingField { key }
            | BindingError::UnknownField { key }
            | BindingError::WrongType { key, .. } => key,
        }
    }
}

fn type_word(t: FieldType) -> &'static str {
    match t {
        FieldType::String => "string",
        FieldType::Bool => "bool (true or false)",
        FieldType::Number => "number",
    }
}

impl Binding {
    /// The line the person adds at `http` level: `include upstreams/<name>.conf;`.
    pub fn include_line(&self) -> String {
        format!("include upstreams/{};", self.name.file_name())
    }

    /// Checks what does not depend on the plugin: plugin, provider and service present, service
    /// without control characters, interval at least [`MIN_INTERVAL`]. (Name and directives are
    /// valid by construction.)
    pub fn validate(&self) -> Result<(), BindingError> {
        if self.plugin.trim().is_empty() {
            return Err(BindingError::EmptyPlugin);
        }
        if self.provider.trim().is_empty() {
            return Err(BindingError::EmptyProvider);
        }
        if self.service.trim().is_empty() {
            return Err(BindingError::EmptyService);
        }
        if self.service.chars().any(char::is_control) {
            return Err(BindingError::ServiceControlChar);
        }
        if self.interval < MIN_INTERVAL {
            return Err(BindingError::IntervalTooShort {
                seconds: self.interval.as_secs(),
            });
        }
        Ok(())
    }

    /// Checks the config against the provider's declared fields: every key declared, every
    /// required field present (a declared `default` counts; `null` or `""` do not), every value of
    /// the declared type. The first problem is returned, naming the field.
    pub fn validate_against(&self, decl: &ProviderDecl) -> Result<(), BindingError> {
        if decl.code != self.provider {
            return Err(BindingError::ProviderMismatch {
                declared: decl.code.clone(),
                used: self.provider.clone(),
            });
        }
        for key in self.config.keys() {
            if decl.field(key).is_none() {
                return Err(BindingError::UnknownField { key: key.clone() });
            }
        }
        for field in &decl.configuration.fields {
            let missing = || BindingError::MissingField {
                key: field.key.clone(),
            };
            match self.config.get(&field.key) {
                None | Some(Value::Null) => {
                    if field.required && field.default.is_none() {
                        return Err(missing());
                    }
                }
                Some(Value::String(s)) if s.is_empty() && field.required => {
                    if field.default.is_none() {
                        return Err(missing());
                    }
                }
                Some(v) => {
                    if !field.field_type.accepts(v) {
                        return Err(BindingError::WrongType {
                            key: field.key.clone(),
                            expected: type_word(field.field_type),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Converts text values of `bool` and `number` fields to JSON `true`/`false` and numbers (for
/// config typed on a command line as `KEY=VALUE`). Other values are left alone; a text that does
/// not convert is an error naming the field (never the value).
pub fn coerce_config(config: &mut ConfigMap, decl: &ProviderDecl) -> Result<(), BindingError> {
    let keys: Vec<String> = config.keys().cloned().collect();
    for key in keys {
        let Some(field) = decl.field(&key) else {
            continue;
        };
        let Some(Value::String(text)) = config.get(&key) else {
            continue;
        };
        let text = text.trim();
        let converted = match field.field_type {
            FieldType::String => continue,
            FieldType::Bool => match text {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            FieldType::Number => serde_json::from_str::<serde_json::Number>(text)
                .ok()
                .map(Value::Number),
        };
        match converted {
            Some(v) => {
                config.insert(key, v);
            }
            None => {
                return Err(BindingError::WrongType {
                    key,
                    expected: type_word(field.field_type),
                })
            }
        }
    }
    Ok(())
}
