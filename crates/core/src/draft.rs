//! A binding as a person submits it, and the one validation that turns it into a [`Binding`] or
//! reports every problem at once ([`BindingDraft::check`]). The API, the web form and the engine
//! all go through it.

use std::time::Duration;

use tributary_protocol::{ConfigMap, ProviderDecl};

use crate::binding::{
    check_drain_secs, check_interval, check_service, coerce_all, config_problems,
};
use crate::schedule::DEFAULT_INTERVAL;
use crate::{Binding, BindingError, ExtraDirective, Probe, UpstreamName};

/// The text of a binding before validation. Field names are those of the API's binding input.
/// The required fields are `Option`s: one left out is reported by [`BindingDraft::check`] like
/// any other invalid field ([`BindingError::Missing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BindingDraft {
    pub name: String,
    pub plugin: Option<String>,
    pub provider: Option<String>,
    /// Config values as given: text of `bool` and `number` fields is converted by
    /// [`BindingDraft::check`] (`"true"`, `"5"`).
    pub config: ConfigMap,
    pub service: Option<String>,
    /// Refresh interval in seconds; `None` means [`DEFAULT_INTERVAL`].
    pub interval_secs: Option<u64>,
    pub directives: Vec<String>,
    /// The module's `probe` parameters; `None` or blank: no probe.
    pub probe: Option<String>,
    /// Seconds a removed target is drained first (0: removed at once).
    pub drain_secs: u64,
}

/// One invalid field: `field` names it as in the API's binding input (`name`, `plugin`,
/// `provider`, `service`, `interval_secs`, `directives`, `probe`, `drain_secs` or a config key); `message` names the
/// problem and never contains a config value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<BindingError> for FieldError {
    fn from(e: BindingError) -> FieldError {
        FieldError::new(e.field(), e.to_string())
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Orders problems by field and keeps the first problem of each field: one message per field,
/// in the same order wherever they are shown.
pub fn tidy_field_errors(errors: &mut Vec<FieldError>) {
    errors.sort_by(|a, b| a.field.cmp(&b.field));
    errors.dedup_by(|later, earlier| later.field == earlier.field);
}

impl BindingDraft {
    /// Validates every field: the name, the service, the interval, each directive and, when the
    /// provider's declaration `decl` is given, the config (text of typed fields converted, every
    /// key declared, required fields present, values of the declared type). Returns the binding,
    /// or every problem at once (one per field, ordered by field).
    pub fn check(&self, decl: Option<&ProviderDecl>) -> Result<Binding, Vec<FieldError>> {
        let mut problems: Vec<BindingError> = Vec::new();
        let name = UpstreamName::parse(&self.name)
            .map_err(|error| {
                problems.push(BindingError::BadName {
                    name: self.name.clone(),
                    error,
                })
            })
            .ok();
        match self.plugin.as_deref() {
            None => problems.push(BindingError::Missing("plugin")),
            Some(p) if p.trim().is_empty() => problems.push(BindingError::EmptyPlugin),
            Some(_) => {}
        }
        match self.provider.as_deref() {
            None => problems.push(BindingError::Missing("provider")),
            Some(p) if p.trim().is_empty() => problems.push(BindingError::EmptyProvider),
            Some(_) => {}
        }
        match self.service.as_deref().map(check_service) {
            None => problems.push(BindingError::Missing("service")),
            Some(Err(e)) => problems.push(e),
            Some(Ok(())) => {}
        }
        let interval = self
            .interval_secs
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_INTERVAL);
        if let Err(e) = check_interval(interval) {
            problems.push(e);
        }
        let mut directives = Vec::with_capacity(self.directives.len());
        for d in &self.directives {
            match ExtraDirective::parse(d) {
                Ok(x) => directives.push(x),
                Err(error) => problems.push(BindingError::BadDirective {
                    directive: d.clone(),
                    error,
                }),
            }
        }
        let probe = match self.probe.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(p) => Probe::parse(p)
                .map_err(|error| problems.push(BindingError::BadProbe { error }))
                .ok(),
        };
        if let Err(e) = check_drain_secs(self.drain_secs) {
            problems.push(e);
        }
        let mut config = self.config.clone();
        let provider = self.provider.as_deref().unwrap_or_default();
        if let Some(decl) = decl {
            let unconverted = coerce_all(&mut config, decl);
            let unconverted_keys: Vec<String> =
                unconverted.iter().map(|e| e.field().to_string()).collect();
            problems.extend(unconverted);
            // A field that did not convert is reported once, as such.
            problems.extend(
                config_problems(provider, &config, decl)
                    .into_iter()
                    .filter(|e| !unconverted_keys.iter().any(|k| k == e.field())),
            );
        }
        match (name, &self.plugin, &self.provider, &self.service) {
            (Some(name), Some(plugin), Some(provider), Some(service)) if problems.is_empty() => {
                Ok(Binding {
                    name,
                    plugin: plugin.clone(),
                    provider: provider.clone(),
                    config,
                    service: service.clone(),
                    interval,
                    directives,
                    probe,
                    drain_secs: self.drain_secs,
                })
            }
            _ => {
                let mut errors: Vec<FieldError> =
                    problems.into_iter().map(FieldError::from).collect();
                tidy_field_errors(&mut errors);
                Err(errors)
            }
        }
    }
}
