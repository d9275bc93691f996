//! Checks each field of a binding on its own, so that the form and the API can report every
//! invalid field at once (the engine, which checks again on save, stops at the first).

use std::collections::BTreeMap;

use tributary_protocol::ProviderDecl;

use crate::engine::Engine;
use crate::view::{BindingInput, BindingView, ErrorDetail};

/// Checks every field of `input` on its own against the provider's declaration `decl` (`edit`: the
/// binding being replaced, whose set secrets may be left out). Field → message, empty when all pass.
pub fn field_errors(
    decl: &ProviderDecl,
    input: &BindingInput,
    edit: Option<&BindingView>,
) -> BTreeMap<String, String> {
    let new = edit.is_none();
    use tributary_core::{coerce_config, BindingError, ExtraDirective, UpstreamName};
    let mut errors = BTreeMap::new();
    if new {
        if let Err(e) = UpstreamName::parse(&input.name) {
            errors.insert(
                "name".into(),
                format!("upstream name {:?}: {e}", input.name),
            );
        }
    }
    if input.service.trim().is_empty() {
        errors.insert("service".into(), BindingError::EmptyService.to_string());
    } else if input.service.chars().any(char::is_control) {
        errors.insert(
            "service".into(),
            BindingError::ServiceControlChar.to_string(),
        );
    } else if input.service.len() > crate::engine::MAX_SERVICE_LEN {
        errors.insert(
            "service".into(),
            format!(
                "service must be at most {} characters",
                crate::engine::MAX_SERVICE_LEN
            ),
        );
    }
    if let Some(n) = input.interval_secs {
        let min = tributary_core::schedule::MIN_INTERVAL.as_secs();
        let max = crate::engine::MAX_INTERVAL_SECS;
        if n < min {
            errors.insert(
                "interval_secs".into(),
                format!("refresh interval {n} s is too short: the minimum is {min} s"),
            );
        } else if n > max {
            errors.insert(
                "interval_secs".into(),
                format!("refresh interval {n} s is too long: the maximum is {max} s"),
            );
        }
    }
    for d in &input.directives {
        if let Err(e) = ExtraDirective::parse(d) {
            errors
                .entry("directives".into())
                .or_insert_with(|| format!("extra directive {d:?}: {e}"));
        }
    }
    for f in &decl.configuration.fields {
        // Absent, null and "" are all "not given" (as the engine sees a required field).
        let given = input
            .config
            .get(&f.key)
            .filter(|v| !v.is_null() && v.as_str() != Some(""));
        match given {
            None => {
                // A secret left empty in an edit keeps its stored value.
                let kept = f.secret
                    && edit.is_some_and(|b| b.secrets.get(&f.key).copied().unwrap_or(false));
                if f.required && f.default.is_none() && !kept {
                    let e = BindingError::MissingField { key: f.key.clone() };
                    errors.insert(f.key.clone(), e.to_string());
                }
            }
            Some(v) => {
                let mut one = tributary_protocol::ConfigMap::new();
                one.insert(f.key.clone(), v.clone());
                if let Err(e) = coerce_config(&mut one, decl) {
                    errors.insert(f.key.clone(), e.to_string());
                }
            }
        }
    }
    errors
}

/// Every invalid field of `input`, as API error details; empty when the plugin or provider is
/// unknown (the engine reports that) or all pass. `path_name`: the name in a `PUT` path. With
/// `reuse_stored`, secret fields left out may take the stored values of the binding of that name
/// (a replace, a test resolution); a create must give them.
pub fn all_fields(
    engine: &Engine,
    input: &BindingInput,
    path_name: Option<&str>,
    reuse_stored: bool,
) -> Vec<ErrorDetail> {
    let Some(decl) = engine.host().provider(&input.plugin, &input.provider) else {
        return Vec::new();
    };
    let mut input = input.clone();
    if let (Some(p), true) = (path_name, input.name.is_empty()) {
        input.name = p.to_string();
    }
    let existing = if reuse_stored {
        engine
            .get(path_name.unwrap_or(&input.name))
            .filter(|b| b.plugin == input.plugin && b.provider == input.provider)
    } else {
        None
    };
    let mut errors = field_errors(&decl, &input, existing.as_ref());
    // Unknown config keys (the form cannot send them; the API can).
    for k in input.config.keys() {
        if decl.field(k).is_none() {
            errors.insert(
                k.clone(),
                tributary_core::BindingError::UnknownField { key: k.clone() }.to_string(),
            );
        }
    }
    errors
        .into_iter()
        .map(|(field, message)| ErrorDetail {
            message,
            field: Some(field),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use tributary_store::{OutcomeRecord, OutcomeStatus};

    fn view(_: Option<OutcomeStatus>) -> BindingView {
        BindingView {
            name: "api".into(),
            plugin: "p".into(),
            provider: "r".into(),
            service: "demo".into(),
            interval_secs: 60,
            directives: vec![],
            config: BTreeMap::new(),
            secrets: BTreeMap::new(),
            include_line: "include upstreams/api.conf;".into(),
            file: "/x/upstreams/api.conf".into(),
            last_outcome: None::<OutcomeRecord>,
            servers: vec![],
            next_refresh_ms: None,
            consecutive_failures: 0,
        }
    }

    #[test]
    fn precheck_reports_every_field_and_keeps_set_secrets() {
        let decl: ProviderDecl = serde_json::from_value(serde_json::json!({
            "code": "r", "name": "R",
            "configuration": {"fields": [
                {"key": "address", "display_name": "Address", "required": true},
                {"key": "token", "display_name": "Token", "required": true, "secret": true},
                {"key": "healthy_only", "display_name": "Healthy", "type": "bool"},
                {"key": "limit", "display_name": "Limit", "type": "number"}
            ]}
        }))
        .unwrap();
        let mut input = BindingInput {
            name: ".x".into(),
            plugin: "p".into(),
            provider: "r".into(),
            config: BTreeMap::from([("limit".to_string(), Value::String("many".into()))]),
            service: "".into(),
            interval_secs: Some(1),
            directives: vec!["include x;".into()],
        };
        let e = field_errors(&decl, &input, None);
        let keys: Vec<&str> = e.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "address",
                "directives",
                "interval_secs",
                "limit",
                "name",
                "service",
                "token"
            ]
        );
        // In an edit, a required secret that is set may be left empty.
        let mut b = view(None);
        b.secrets.insert("token".into(), true);
        input
            .config
            .insert("address".into(), Value::String("a".into()));
        let e = field_errors(&decl, &input, Some(&b));
        assert!(
            !e.contains_key("token") && !e.contains_key("address") && !e.contains_key("name"),
            "{e:?}"
        );
    }
}
