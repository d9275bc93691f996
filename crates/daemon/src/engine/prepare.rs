//! Validation of an input into a binding and its stored record.

use std::time::Duration;

use tributary_core::{schedule, Binding, ExtraDirective, UpstreamName};
use tributary_protocol::{ConfigMap, ProviderDecl};
use tributary_store::BindingRecord;

use super::{lock, Engine, EngineError, MAX_INTERVAL_SECS, MAX_SERVICE_LEN};
use crate::view::BindingInput;

impl Engine {
    /// Validates `input` as a save would (secret fields left out keep the stored values of the
    /// binding `path_name`) without saving anything: for a test resolution.
    pub fn preview_binding(
        &self,
        input: &BindingInput,
        path_name: Option<&str>,
    ) -> Result<Binding, EngineError> {
        let name = path_name.unwrap_or(&input.name);
        let previous = lock(&self.inner.slots)
            .get(name)
            .map(|s| lock(&s.state).record.clone());
        self.prepare(input, path_name, previous.as_ref())
            .map(|(b, _)| b)
    }

    /// Validates `input` (name taken from `path_name` when given) into a binding and its record.
    /// Secret fields absent from `input` keep their value from `previous`.
    pub(crate) fn prepare(
        &self,
        input: &BindingInput,
        path_name: Option<&str>,
        previous: Option<&BindingRecord>,
    ) -> Result<(Binding, BindingRecord), EngineError> {
        let name = match path_name {
            Some(p) if !input.name.is_empty() && input.name != p => {
                return Err(EngineError::invalid(
                    "name",
                    format!(
                        "the name in the body ({:?}) differs from the one in the path ({p:?})",
                        input.name
                    ),
                ))
            }
            Some(p) => p.to_string(),
            None => input.name.clone(),
        };
        UpstreamName::parse(&name)
            .map_err(|e| EngineError::invalid("name", format!("upstream name {name:?}: {e}")))?;
        for d in &input.directives {
            ExtraDirective::parse(d).map_err(|e| {
                EngineError::invalid("directives", format!("extra directive {d:?}: {e}"))
            })?;
        }
        let interval = input
            .interval_secs
            .unwrap_or(schedule::DEFAULT_INTERVAL.as_secs());
        let min = schedule::MIN_INTERVAL.as_secs();
        if interval < min {
            return Err(EngineError::invalid(
                "interval_secs",
                format!("refresh interval {interval} s is too short: the minimum is {min} s"),
            ));
        }
        if interval > MAX_INTERVAL_SECS {
            return Err(EngineError::invalid(
                "interval_secs",
                format!(
                    "refresh interval {interval} s is too long: the maximum is {MAX_INTERVAL_SECS} s"
                ),
            ));
        }
        if input.service.len() > MAX_SERVICE_LEN {
            return Err(EngineError::invalid(
                "service",
                format!("service must be at most {MAX_SERVICE_LEN} characters"),
            ));
        }
        let decl = self.provider_decl(&input.plugin, &input.provider)?;
        let mut config = input.config.clone();
        if let Some(prev) = previous {
            if prev.plugin == input.plugin && prev.provider == input.provider {
                for f in decl.configuration.fields.iter().filter(|f| f.secret) {
                    if !config.contains_key(&f.key) {
                        if let Some(v) = prev.config.get(&f.key) {
                            config.insert(f.key.clone(), v.clone());
                        }
                    }
                }
            }
        }
        let record = BindingRecord {
            name,
            plugin: input.plugin.clone(),
            provider: input.provider.clone(),
            config,
            service: input.service.clone(),
            interval_secs: interval,
            directives: input.directives.clone(),
        };
        let binding = record_to_binding_with(&record, Some(&decl))?;
        // Store the config as the plugin receives it (typed values after coercion).
        let record = BindingRecord {
            config: binding.config.as_map().clone(),
            ..record
        };
        Ok((binding, record))
    }

    fn provider_decl(&self, plugin: &str, provider: &str) -> Result<ProviderDecl, EngineError> {
        if !self.inner.host.plugins().iter().any(|p| p.name == plugin) {
            return Err(EngineError::invalid(
                "plugin",
                format!("no plugin named {plugin:?} is loaded"),
            ));
        }
        self.inner.host.provider(plugin, provider).ok_or_else(|| {
            EngineError::invalid(
                "provider",
                format!("plugin {plugin:?} has no provider {provider:?}"),
            )
        })
    }
}

/// Converts a stored record back into a core binding (no provider declaration check).
pub fn record_to_binding(rec: &BindingRecord) -> Result<Binding, EngineError> {
    record_to_binding_with(rec, None)
}

fn record_to_binding_with(
    rec: &BindingRecord,
    decl: Option<&ProviderDecl>,
) -> Result<Binding, EngineError> {
    let name = UpstreamName::parse(&rec.name)
        .map_err(|e| EngineError::invalid("name", format!("upstream name {:?}: {e}", rec.name)))?;
    let mut directives = Vec::with_capacity(rec.directives.len());
    for d in &rec.directives {
        directives.push(ExtraDirective::parse(d).map_err(|e| {
            EngineError::invalid("directives", format!("extra directive {d:?}: {e}"))
        })?);
    }
    let mut config = ConfigMap::from(rec.config.clone());
    if let Some(decl) = decl {
        tributary_core::coerce_config(&mut config, decl).map_err(binding_error)?;
    }
    let binding = Binding {
        name,
        plugin: rec.plugin.clone(),
        provider: rec.provider.clone(),
        config,
        service: rec.service.clone(),
        interval: Duration::from_secs(rec.interval_secs),
        directives,
    };
    binding.validate().map_err(binding_error)?;
    if let Some(decl) = decl {
        binding.validate_against(decl).map_err(binding_error)?;
    }
    Ok(binding)
}

fn binding_error(e: tributary_core::BindingError) -> EngineError {
    EngineError::Invalid {
        message: e.to_string(),
        field: Some(e.field().to_string()),
    }
}
