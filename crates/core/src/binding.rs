//! A binding: an upstream name bound to a plugin's provider, its config, a service, an interval
//! and extra directives. Validated when saved: [`BindingDraft::check`] (in `draft.rs`) reports
//! every problem at once; [`Binding::validate`] and [`Binding::validate_against`] the first one.

use std::time::Duration;

use serde_json::Value;
use tributary_protocol::{ConfigMap, FieldType, ProviderDecl};

use crate::probe::{ProbeError, MAX_DRAIN_SECS};
use crate::schedule::{MAX_INTERVAL, MIN_INTERVAL};
use crate::{DirectiveError, ExtraDirective, NameError, Probe, UpstreamName};

/// Longest service string accepted (bytes).
pub const MAX_SERVICE_LEN: usize = 1024;

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
    /// The module's `probe` parameters, written as `probe <params>;` in live mode only.
    pub probe: Option<Probe>,
    /// Graceful removal: a target that left discovery is drained for up to this long (or until
    /// it has no request in flight) before it is removed; 0 removes it at once. Live mode only.
    pub drain_secs: u64,
}

/// Why a binding cannot be saved. Texts name the field at fault and never contain a config value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("upstream name {name:?}: {error}")]
    BadName { name: String, error: NameError },
    #[error("extra directive {directive:?}: {error}")]
    BadDirective {
        directive: String,
        error: DirectiveError,
    },
    /// A required field (`plugin`, `provider` or `service`) left out.
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("plugin is empty")]
    EmptyPlugin,
    #[error("provider is empty")]
    EmptyProvider,
    #[error("service is empty")]
    EmptyService,
    #[error("service contains a control character")]
    ServiceControlChar,
    #[error("service must be at most {MAX_SERVICE_LEN} bytes")]
    ServiceTooLong,
    #[error(
        "refresh interval {seconds} s is too short: the minimum is {} s",
        MIN_INTERVAL.as_secs()
    )]
    IntervalTooShort { seconds: u64 },
    #[error(
        "refresh interval {seconds} s is too long: the maximum is {} s",
        MAX_INTERVAL.as_secs()
    )]
    IntervalTooLong { seconds: u64 },
    #[error("the declaration is for provider {declared:?}, the binding uses {used:?}")]
    ProviderMismatch { declared: String, used: String },
    #[error("{error}")]
    BadProbe { error: ProbeError },
    #[error("drain_secs {seconds} is too long: the maximum is {MAX_DRAIN_SECS} (one day)")]
    DrainTooLong { seconds: u64 },
    #[error("config field {key:?} is required")]
    MissingField { key: String },
    #[error("config field {key:?} is not declared by the provider")]
    UnknownField { key: String },
    #[error("config field {key:?} must be a {expected}")]
    WrongType { key: String, expected: &'static str },
}

impl BindingError {
    /// The field at fault, named as in the API's binding input: a config key, `"name"`,
    /// `"plugin"`, `"provider"`, `"service"`, `"interval_secs"`, `"directives"`, `"probe"` or
    /// `"drain_secs"`.
    pub fn field(&self) -> &str {
        match self {
            BindingError::BadName { .. } => "name",
            BindingError::BadDirective { .. } => "directives",
            BindingError::Missing(field) => field,
            BindingError::EmptyPlugin => "plugin",
            BindingError::EmptyProvider | BindingError::ProviderMismatch { .. } => "provider",
            BindingError::EmptyService
            | BindingError::ServiceControlChar
            | BindingError::ServiceTooLong => "service",
            BindingError::IntervalTooShort { .. } | BindingError::IntervalTooLong { .. } => {
                "interval_secs"
            }
            BindingError::BadProbe { .. } => "probe",
            BindingError::DrainTooLong { .. } => "drain_secs",
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

    /// The directives of the upstream file: the person's, then in live mode (`live`: the file
    /// carries a `zone`) the `probe` line.
    pub fn file_directives(&self, live: bool) -> Vec<ExtraDirective> {
        let mut out = self.directives.clone();
        if let (true, Some(p)) = (live, &self.probe) {
            out.push(p.directive());
        }
        out
    }

    /// Checks what does not depend on the plugin: plugin, provider and service present, service
    /// without control characters and at most [`MAX_SERVICE_LEN`] bytes, interval between
    /// [`MIN_INTERVAL`] and [`MAX_INTERVAL`]. (Name and directives are valid by construction.)
    /// The first problem is returned.
    pub fn validate(&self) -> Result<(), BindingError> {
        first(self.problems())
    }

    /// Every problem [`Binding::validate`] looks for, one per field.
    pub fn problems(&self) -> Vec<BindingError> {
        let mut out = Vec::new();
        if self.plugin.trim().is_empty() {
            out.push(BindingError::EmptyPlugin);
        }
        if self.provider.trim().is_empty() {
            out.push(BindingError::EmptyProvider);
        }
        if let Err(e) = check_service(&self.service) {
            out.push(e);
        }
        if let Err(e) = check_interval(self.interval) {
            out.push(e);
        }
        if let Err(e) = check_drain_secs(self.drain_secs) {
            out.push(e);
        }
        out
    }

    /// Checks the config against the provider's declared fields: every key declared, every
    /// required field present (a declared `default` counts; `null` or `""` do not), every value of
    /// the declared type. The first problem is returned, naming the field.
    pub fn validate_against(&self, decl: &ProviderDecl) -> Result<(), BindingError> {
        first(config_problems(&self.provider, &self.config, decl))
    }
}

fn first(problems: Vec<BindingError>) -> Result<(), BindingError> {
    match problems.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub(crate) fn check_service(service: &str) -> Result<(), BindingError> {
    if service.trim().is_empty() {
        Err(BindingError::EmptyService)
    } else if service.chars().any(char::is_control) {
        Err(BindingError::ServiceControlChar)
    } else if service.len() > MAX_SERVICE_LEN {
        Err(BindingError::ServiceTooLong)
    } else {
        Ok(())
    }
}

pub(crate) fn check_interval(interval: Duration) -> Result<(), BindingError> {
    let seconds = interval.as_secs();
    if interval < MIN_INTERVAL {
        Err(BindingError::IntervalTooShort { seconds })
    } else if interval > MAX_INTERVAL {
        Err(BindingError::IntervalTooLong { seconds })
    } else {
        Ok(())
    }
}

pub(crate) fn check_drain_secs(seconds: u64) -> Result<(), BindingError> {
    if seconds > MAX_DRAIN_SECS {
        Err(BindingError::DrainTooLong { seconds })
    } else {
        Ok(())
    }
}

/// Every problem of `config` against the declaration of `provider`, in this order: a provider
/// mismatch, unknown keys (sorted), then the declared fields in declaration order.
pub(crate) fn config_problems(
    provider: &str,
    config: &ConfigMap,
    decl: &ProviderDecl,
) -> Vec<BindingError> {
    let mut out = Vec::new();
    if decl.code != provider {
        out.push(BindingError::ProviderMismatch {
            declared: decl.code.clone(),
            used: provider.to_string(),
        });
    }
    for key in config.keys() {
        if decl.field(key).is_none() {
            out.push(BindingError::UnknownField { key: key.clone() });
        }
    }
    for field in &decl.configuration.fields {
        let missing = || BindingError::MissingField {
            key: field.key.clone(),
        };
        match config.get(&field.key) {
            None | Some(Value::Null) => {
                if field.required && field.default.is_none() {
                    out.push(missing());
                }
            }
            Some(Value::String(s)) if s.is_empty() && field.required => {
                if field.default.is_none() {
                    out.push(missing());
                }
            }
            Some(v) => {
                if !field.field_type.accepts(v) {
                    out.push(BindingError::WrongType {
                        key: field.key.clone(),
                        expected: type_word(field.field_type),
                    });
                }
            }
        }
    }
    out
}

/// Converts text values of `bool` and `number` fields to JSON `true`/`false` and numbers (for
/// config typed on a command line as `KEY=VALUE`). Other values are left alone; a text that does
/// not convert is an error naming the field (never the value). The first problem is returned.
pub fn coerce_config(config: &mut ConfigMap, decl: &ProviderDecl) -> Result<(), BindingError> {
    first(coerce_all(config, decl))
}

/// [`coerce_config`] that converts what it can and returns every field that does not convert.
pub(crate) fn coerce_all(config: &mut ConfigMap, decl: &ProviderDecl) -> Vec<BindingError> {
    let mut out = Vec::new();
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
            None => out.push(BindingError::WrongType {
                key,
                expected: type_word(field.field_type),
            }),
        }
    }
    out
}
