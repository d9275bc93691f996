//! The create/edit form: rendered from the provider's declared fields, read back into a binding
//! input, errors placed next to their fields.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};
use serde_json::Value;
use tributary_protocol::{FieldDecl, FieldType, ProviderDecl};

use super::get_field;
use super::html::{csrf_field, page};
use super::widgets::{dropped_list, targets_table};
use crate::engine::EngineError;
use crate::http::auth::session::Session;
use crate::view::Preview;
use crate::view::{BindingInput, BindingView};

/// What the form shows: the person's values (never secret values), errors by field, a preview.
#[derive(Default)]
pub(super) struct FormState {
    pub(super) name: String,
    pub(super) service: String,
    pub(super) interval: String,
    pub(super) directives: String,
    pub(super) probe: String,
    pub(super) drain_secs: String,
    pub(super) values: BTreeMap<String, String>,
    pub(super) checked: BTreeSet<String>,
    pub(super) errors: BTreeMap<String, String>,
    pub(super) top_error: Option<String>,
    pub(super) preview: Option<Preview>,
}

pub(super) const FIXED: [&str; 8] = [
    "name",
    "service",
    "interval_secs",
    "directives",
    "probe",
    "drain_secs",
    "plugin",
    "provider",
];

/// The error message of `key` next to its input (nothing when it is valid).
pub(super) fn field_error(st: &FormState, key: &str) -> Option<Markup> {
    st.errors.get(key).map(|m| {
        html! { span.field-error id={"err-" (key)} role="alert" { (m) } }
    })
}

/// One labelled row of the form: label (with `*` when required), control, hint, error.
pub(super) fn input_row(
    label: &str,
    id: &str,
    required: bool,
    control: Markup,
    hint: Option<&str>,
    err: Option<Markup>,
) -> Markup {
    html! {
        div class=(if err.is_some() { "row invalid" } else { "row" }) {
            label for=(id) {
                (label)
                @if required {
                    " " span.req title="required" { "*" }
                }
            }
            (control)
            @if let Some(h) = hint {
                small { (h) }
            }
            @if let Some(e) = err {
                (e)
            }
        }
    }
}

pub(super) fn render_form(
    s: &Session,
    decl: &ProviderDecl,
    plugin: &str,
    edit: Option<&BindingView>,
    fs: &FormState,
    status: StatusCode,
) -> Response {
    let action = match edit {
        Some(b) => format!("/ui/bindings/{}/edit", b.name),
        None => "/ui/new".into(),
    };
    let title = match edit {
        Some(b) => format!("Edit {}", b.name),
        None => format!("New binding: {}", decl.name),
    };
    let name_ctl = match edit {
        Some(b) => html! { input #f-name name="name" value=(b.name) readonly; },
        None => html! {
            input #f-name name="name" value=(fs.name) required
                pattern="[A-Za-z0-9_][A-Za-z0-9_.\\-]*";
        },
    };
    let body = html! {
        h1 { (title) }
        @if let Some(e) = &fs.top_error {
            p.error role="alert" { (e) }
        }
        form.card.binding-form method="post" action=(action) novalidate {
            (csrf_field(&s.csrf))
            input type="hidden" name="plugin" value=(plugin);
            input type="hidden" name="provider" value=(decl.code);
            p { "Plugin " b { (plugin) } ", provider " b { (decl.code) } " (" (decl.name) ")" }
            (input_row(
                "Upstream name",
                "f-name",
                true,
                name_ctl,
                Some("letters, digits, _ - . (the file is upstreams/<name>.conf)"),
                field_error(fs, "name"),
            ))
            (input_row(
                "Service",
                "f-service",
                true,
                html! { input #f-service name="service" value=(fs.service) required; },
                Some("the service in the provider's own terms"),
                field_error(fs, "service"),
            ))
            @for f in &decl.configuration.fields {
                (config_row(f, edit, fs))
            }
            (input_row(
                "Refresh interval (seconds)",
                "f-interval",
                false,
                html! {
                    input #f-interval name="interval_secs" inputmode="numeric" value=(fs.interval)
                        placeholder="60";
                },
                Some("10 to 604800; default 60"),
                field_error(fs, "interval_secs"),
            ))
            (input_row(
                "Extra directives",
                "f-directives",
                false,
                html! {
                    textarea #f-directives name="directives" rows="3" placeholder="keepalive 32;" {
                        (fs.directives)
                    }
                },
                Some("one per line, e.g. keepalive 32;"),
                field_error(fs, "directives"),
            ))
            (input_row(
                "Health probe",
                "f-probe",
                false,
                html! {
                    input #f-probe name="probe" value=(fs.probe)
                        placeholder="uri=/healthz interval=1s fails=2 passes=2";
                },
                Some("live mode: the parameters of the module's probe directive, written as probe ...; in the upstream block (empty: none)"),
                field_error(fs, "probe"),
            ))
            (input_row(
                "Drain before removal (seconds)",
                "f-drain",
                false,
                html! {
                    input #f-drain name="drain_secs" inputmode="numeric" value=(fs.drain_secs)
                        placeholder="0";
                },
                Some("live mode: a server that leaves discovery gets no new requests and is removed after this long, or once it has none in flight; 0: removed at once"),
                field_error(fs, "drain_secs"),
            ))
            div.actions {
                button type="submit" name="action" value="save" { "Save" }
                button.secondary type="submit" name="action" value="test" { "Test resolve" }
            }
        }
        @if let Some(p) = &fs.preview {
            (preview_section(p))
        }
    };
    page(status, &title, Some(&s.csrf), body)
}

/// The row of one declared config field: a checkbox for `bool`, an always empty password input
/// for `secret` (the value is never sent back), a text input otherwise.
fn config_row(f: &FieldDecl, edit: Option<&BindingView>, fs: &FormState) -> Markup {
    let id = format!("cfg-{}", f.key);
    let name = format!("cfg.{}", f.key);
    let err = if FIXED.contains(&f.key.as_str()) {
        None
    } else {
        field_error(fs, &f.key)
    };
    let ctl = if f.field_type == FieldType::Bool {
        html! {
            input type="checkbox" id=(id) name=(name) value="true" checked[fs.checked.contains(&f.key)];
        }
    } else if f.secret {
        let set = edit.is_some_and(|b| b.secrets.get(&f.key).copied().unwrap_or(false));
        html! {
            input type="password" id=(id) name=(name) value="" autocomplete="new-password"
                placeholder=(if set { "set — leave empty to keep" } else { "" })
                required[f.required && !set];
        }
    } else {
        html! {
            input type="text" id=(id) name=(name)
                value=(fs.values.get(&f.key).map(String::as_str).unwrap_or(""))
                inputmode=[(f.field_type == FieldType::Number).then_some("numeric")]
                required[f.required];
        }
    };
    input_row(
        &f.display_name,
        &id,
        f.required,
        ctl,
        f.description.as_deref(),
        err,
    )
}

/// What a test resolution would write (nothing was saved or applied).
fn preview_section(p: &Preview) -> Markup {
    html! {
        section.card.preview #preview {
            h2 { "Test resolve (nothing was saved or applied)" }
            p {
                span class={"status " (if p.result == "ok" { "ok" } else { "failed" })} { (p.result) }
                " " (p.why.as_deref().unwrap_or(""))
            }
            @if let Some(c) = p.code {
                p {
                    "Plugin error code " span.code { (c) }
                    @if let Some(f) = &p.field {
                        ", field " span.field { (f) }
                    }
                }
            }
            (targets_table(&p.targets))
            @if !p.dropped.is_empty() {
                (dropped_list(&p.dropped))
            }
            @if let Some(r) = &p.rendered {
                h3 { "Would be written" }
                pre #preview-file { (r) }
            }
        }
    }
}

/// Builds the input from the form; interval text that is not a number is reported in
/// `fs.errors` (and left out of the input).
pub(super) fn input_from_form(
    decl: &ProviderDecl,
    plugin: &str,
    f: &[(String, String)],
    fs: &mut FormState,
) -> BindingInput {
    fs.name = get_field(f, "name").unwrap_or("").trim().to_string();
    fs.service = get_field(f, "service").unwrap_or("").to_string();
    fs.interval = get_field(f, "interval_secs")
        .unwrap_or("")
        .trim()
        .to_string();
    fs.directives = get_field(f, "directives").unwrap_or("").to_string();
    fs.probe = get_field(f, "probe").unwrap_or("").trim().to_string();
    fs.drain_secs = get_field(f, "drain_secs").unwrap_or("").trim().to_string();
    let mut config = BTreeMap::new();
    for fd in &decl.configuration.fields {
        let v = get_field(f, &format!("cfg.{}", fd.key));
        if fd.field_type == FieldType::Bool {
            let on = v.is_some_and(|v| v == "true" || v == "on");
            if on {
                fs.checked.insert(fd.key.clone());
            }
            config.insert(fd.key.clone(), Value::Bool(on));
            continue;
        }
        let v = v.unwrap_or("");
        if !fd.secret {
            fs.values.insert(fd.key.clone(), v.to_string());
        }
        if !v.trim().is_empty() {
            config.insert(fd.key.clone(), Value::String(v.to_string()));
        }
    }
    let interval_secs = if fs.interval.is_empty() {
        None
    } else {
        match fs.interval.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                fs.errors.insert(
                    "interval_secs".into(),
                    "the refresh interval must be a whole number of seconds".into(),
                );
                None
            }
        }
    };
    let drain_secs = if fs.drain_secs.is_empty() {
        None
    } else {
        match fs.drain_secs.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                fs.errors.insert(
                    "drain_secs".into(),
                    "the drain time must be a whole number of seconds".into(),
                );
                None
            }
        }
    };
    BindingInput {
        name: fs.name.clone(),
        plugin: Some(plugin.to_string()),
        provider: Some(decl.code.clone()),
        config,
        service: Some(fs.service.clone()),
        interval_secs,
        directives: fs
            .directives
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
        probe: (!fs.probe.is_empty()).then(|| fs.probe.clone()),
        drain_secs,
    }
}

/// Places an engine error on the form (invalid fields next to their inputs, the rest on top) and
/// returns the status the page answers with ([`EngineError::http_status`], as the API).
pub(super) fn put_error(fs: &mut FormState, decl: &ProviderDecl, e: EngineError) -> StatusCode {
    let status = e.http_status();
    match e {
        EngineError::Invalid(errors) => {
            let mut elsewhere = Vec::new();
            for e in errors {
                if FIXED.contains(&e.field.as_str()) || decl.field(&e.field).is_some() {
                    fs.errors.entry(e.field).or_insert(e.message);
                } else {
                    elsewhere.push(e.message);
                }
            }
            if !elsewhere.is_empty() {
                fs.top_error = Some(elsewhere.join("; "));
            }
        }
        EngineError::Duplicate(n) => {
            fs.errors.insert(
                "name".into(),
                format!("a binding named {n:?} already exists"),
            );
        }
        e => fs.top_error = Some(e.to_string()),
    }
    status
}
