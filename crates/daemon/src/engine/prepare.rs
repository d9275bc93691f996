//! An input turned into a binding and its stored record, through the one binding validation of
//! `tributary-core` ([`BindingDraft::check`]).

use tributary_core::{tidy_field_errors, Binding, BindingDraft, FieldError};
use tributary_protocol::{ConfigMap, ProviderDecl};
use tributary_store::BindingRecord;

use super::{lock, Engine, EngineError};
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

    /// Validates `input` (name taken from `path_name` when given) into a binding and its record,
    /// reporting every invalid field at once ([`BindingDraft::check`]). Secret fields absent from
    /// `input` keep their value from `previous` unless an `endpoint` field changed (any
    /// non-secret field when the provider marks none; [`ProviderDecl::carry_secrets`]: then each
    /// secret field left out is reported invalid).
    pub(crate) fn prepare(
        &self,
        input: &BindingInput,
        path_name: Option<&str>,
        previous: Option<&BindingRecord>,
    ) -> Result<(Binding, BindingRecord), EngineError> {
        let mut errors = Vec::new();
        let name = match path_name {
            Some(p) if !input.name.is_empty() && input.name != p => {
                errors.push(FieldError::new(
                    "name",
                    format!(
                        "the name in the body ({:?}) differs from the one in the path ({p:?})",
                        input.name
                    ),
                ));
                p.to_string()
            }
            Some(p) => p.to_string(),
            None => input.name.clone(),
        };
        // A plugin or provider left out is reported by the check.
        let decl = match (&input.plugin, &input.provider) {
            (Some(plugin), Some(provider)) => self
                .provider_decl(plugin, provider)
                .map_err(|e| errors.push(e))
                .ok(),
            _ => None,
        };
        let mut config = ConfigMap::from(input.config.clone());
        if let (Some(prev), Some(decl)) = (previous, &decl) {
            if input.plugin.as_ref() == Some(&prev.plugin)
                && input.provider.as_ref() == Some(&prev.provider)
            {
                // Kept only while every `endpoint` field is unchanged (every non-secret field
                // when the provider marks none): a stored secret is never sent to an endpoint it
                // was not saved with.
                let stored = ConfigMap::from(prev.config.clone());
                if let Err(e) = decl.carry_secrets(&stored, &mut config) {
                    let message = e.to_string();
                    errors.extend(e.secrets.iter().map(|k| FieldError::new(k, &message)));
                }
            }
        }
        let draft = BindingDraft {
            name,
            plugin: input.plugin.clone(),
            provider: input.provider.clone(),
            config,
            service: input.service.clone(),
            interval_secs: input.interval_secs,
            directives: input.directives.clone(),
            probe: input.probe.clone(),
            drain_secs: input.drain_secs.unwrap_or(0),
        };
        // The probe line and graceful removal work through the module's zone and live API. Said
        // after the fields' own checks: a malformed value is reported as such first.
        let mut mode = Vec::new();
        if !self.inner.opts.live.zoned() {
            let why = "needs the live apply mode (tributary serve --apply live|auto with \
                       --live-api): without it the upstream has no zone";
            if draft.probe.as_deref().is_some_and(|p| !p.trim().is_empty()) {
                mode.push(FieldError::new("probe", format!("probe {why}")));
            }
            if draft.drain_secs > 0 {
                mode.push(FieldError::new("drain_secs", format!("drain_secs {why}")));
            }
        }
        let binding = match draft.check(decl.as_ref()) {
            Ok(b) if errors.is_empty() && mode.is_empty() => b,
            checked => {
                if let Err(more) = checked {
                    errors.extend(more);
                }
                errors.extend(mode);
                tidy_field_errors(&mut errors);
                return Err(EngineError::Invalid(errors));
            }
        };
        // Store the config as the plugin receives it (typed values after coercion).
        let record = BindingRecord {
            name: draft.name,
            plugin: binding.plugin.clone(),
            provider: binding.provider.clone(),
            config: binding.config.as_map().clone(),
            service: binding.service.clone(),
            interval_secs: binding.interval.as_secs(),
            directives: draft.directives,
            probe: binding.probe.as_ref().map(|p| p.as_str().to_string()),
            drain_secs: binding.drain_secs,
        };
        Ok((binding, record))
    }

    fn provider_decl(&self, plugin: &str, provider: &str) -> Result<ProviderDecl, FieldError> {
        if !self.inner.host.plugins().iter().any(|p| p.name == plugin) {
            return Err(FieldError::new(
                "plugin",
                format!("no plugin named {plugin:?} is loaded"),
            ));
        }
        self.inner.host.provider(plugin, provider).ok_or_else(|| {
            FieldError::new(
                "provider",
                format!("plugin {plugin:?} has no provider {provider:?}"),
            )
        })
    }
}

/// Converts a stored record back into a core binding (no provider declaration check).
pub fn record_to_binding(rec: &BindingRecord) -> Result<Binding, EngineError> {
    BindingDraft {
        name: rec.name.clone(),
        plugin: Some(rec.plugin.clone()),
        provider: Some(rec.provider.clone()),
        config: ConfigMap::from(rec.config.clone()),
        service: Some(rec.service.clone()),
        interval_secs: Some(rec.interval_secs),
        directives: rec.directives.clone(),
        probe: rec.probe.clone(),
        drain_secs: rec.drain_secs,
    }
    .check(None)
    .map_err(EngineError::Invalid)
}
