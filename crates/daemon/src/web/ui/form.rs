//! The create/edit form: rendered from the provider's declared fields, read back into a binding input, errors placed next to their fields.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;
use tributary_protocol::{FieldType, ProviderDecl};

use super::get_field;
use super::widgets::{dropped_list, targets_table};
use crate::engine::EngineError;
use crate::view::{BindingInput, BindingView};
use crate::web::api_extra::Preview;
use crate::web::html::{esc, page};
use crate::web::session::Session;

/// What the form shows: the person's values (never secret values), errors by field, a preview.
#[derive(Default)]
pub(super) struct FormState {
    pub(super) name: String,
    pub(super) service: String,
    pub(super) interval: String,
    pub(super) directives: String,
    pub(super) values: BTreeMap<String, String>,
    pub(super) checked: BTreeSet<String>,
    pub(super) errors: BTreeMap<String, String>,
    pub(super) top_error: Option<String>,
    pub(super) preview: Option<Preview>,
}

pub(super) const FIXED: [&str; 6] = [
    "name",
    "service",
    "interval_secs",
    "directives",
    "plugin",
    "provider",
];

pub(super) fn field_error(st: &FormState, key: &str) -> String {
    st.errors
        .get(key)
        .map(|m| {
            format!(
                "<span class=\"field-error\" id=\"err-{}\" role=\"alert\">{}</span>",
                esc(key),
                esc(m)
            )
        })
        .unwrap_or_default()
}

pub(super) fn input_row(
    label: &str,
    id: &str,
    required: bool,
    control: &str,
    hint: Option<&str>,
    err: &str,
) -> String {
    format!(
        "<div class=\"row{}\"><label for=\"{id}\">{}{}</label>{control}{}{err}</div>",
        if err.is_empty() { "" } else { " invalid" },
        esc(label),
        if required {
            " <span class=\"req\" title=\"required\">*</span>"
        } else {
            ""
        },
        hint.map(|h| format!("<small>{}</small>", esc(h)))
            .unwrap_or_default()
    )
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
        Some(b) => format!("/ui/bindings/{}/edit", esc(&b.name)),
        None => "/ui/new".into(),
    };
    let title = match edit {
        Some(b) => format!("Edit {}", b.name),
        None => format!("New binding: {}", decl.name),
    };
    let mut body = format!("<h1>{}</h1>", esc(&title));
    if let Some(e) = &fs.top_error {
        body.push_str(&format!("<p class=\"error\" role=\"alert\">{}</p>", esc(e)));
    }
    body.push_str(&format!(
        "<form method=\"post\" action=\"{action}\" class=\"card binding-form\" novalidate>\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"plugin\" value=\"{}\"><input type=\"hidden\" name=\"provider\" value=\"{}\">\
         <p>Plugin <b>{}</b>, provider <b>{}</b> ({})</p>",
        esc(&s.csrf),
        esc(plugin),
        esc(&decl.code),
        esc(plugin),
        esc(&decl.code),
        esc(&decl.name)
    ));
    let name_ctl = match edit {
        Some(b) => format!("<input id=\"f-name\" name=\"name\" value=\"{}\" readonly>", esc(&b.name)),
        None => format!(
            "<input id=\"f-name\" name=\"name\" value=\"{}\" required pattern=\"[A-Za-z0-9_][A-Za-z0-9_.\\-]*\">",
            esc(&fs.name)
        ),
    };
    body.push_str(&input_row(
        "Upstream name",
        "f-name",
        true,
        &name_ctl,
        Some("letters, digits, _ - . (the file is upstreams/<name>.conf)"),
        &field_error(fs, "name"),
    ));
    body.push_str(&input_row(
        "Service",
        "f-service",
        true,
        &format!(
            "<input id=\"f-service\" name=\"service\" value=\"{}\" required>",
            esc(&fs.service)
        ),
        Some("the service in the provider's own terms"),
        &field_error(fs, "service"),
    ));
    for f in &decl.configuration.fields {
        let id = format!("cfg-{}", f.key);
        let name = format!("cfg.{}", f.key);
        let err = if FIXED.contains(&f.key.as_str()) {
            String::new()
        } else {
            field_error(fs, &f.key)
        };
        let ctl = if f.field_type == FieldType::Bool {
            format!(
                "<input type=\"checkbox\" id=\"{}\" name=\"{}\" value=\"true\"{}>",
                esc(&id),
                esc(&name),
                if fs.checked.contains(&f.key) {
                    " checked"
                } else {
                    ""
                }
            )
        } else if f.secret {
            let set = edit.is_some_and(|b| b.secrets.get(&f.key).copied().unwrap_or(false));
            format!(
                "<input type=\"password\" id=\"{}\" name=\"{}\" value=\"\" autocomplete=\"new-password\" placeholder=\"{}\"{}>",
                esc(&id),
                esc(&name),
                if set { "set — leave empty to keep" } else { "" },
                if f.required && !set { " required" } else { "" }
            )
        } else {
            format!(
                "<input type=\"text\" id=\"{}\" name=\"{}\" value=\"{}\"{}{}>",
                esc(&id),
                esc(&name),
                esc(fs.values.get(&f.key).map(String::as_str).unwrap_or("")),
                if f.field_type == FieldType::Number {
                    " inputmode=\"numeric\""
                } else {
                    ""
                },
                if f.required { " required" } else { "" }
            )
        };
        body.push_str(&input_row(
            &f.display_name,
            &id,
            f.required,
            &ctl,
            f.description.as_deref(),
            &err,
        ));
    }
    body.push_str(&input_row(
        "Refresh interval (seconds)",
        "f-interval",
        false,
        &format!("<input id=\"f-interval\" name=\"interval_secs\" inputmode=\"numeric\" value=\"{}\" placeholder=\"60\">", esc(&fs.interval)),
        Some("10 to 604800; default 60"),
        &field_error(fs, "interval_secs"),
    ));
    body.push_str(&input_row(
        "Extra directives",
        "f-directives",
        false,
        &format!("<textarea id=\"f-directives\" name=\"directives\" rows=\"3\" placeholder=\"keepalive 32;\">{}</textarea>", esc(&fs.directives)),
        Some("one per line, e.g. keepalive 32;"),
        &field_error(fs, "directives"),
    ));
    body.push_str(
        "<div class=\"actions\"><button type=\"submit\" name=\"action\" value=\"save\">Save</button>\
         <button type=\"submit\" name=\"action\" value=\"test\" class=\"secondary\">Test resolve</button></div></form>",
    );
    if let Some(p) = &fs.preview {
        body.push_str("<section class=\"card preview\" id=\"preview\"><h2>Test resolve (nothing was saved or applied)</h2>");
        body.push_str(&format!(
            "<p><span class=\"status {}\">{}</span> {}</p>",
            if p.result == "ok" { "ok" } else { "failed" },
            esc(&p.result),
            esc(p.why.as_deref().unwrap_or(""))
        ));
        if let Some(c) = p.code {
            body.push_str(&format!(
                "<p>Plugin error code <span class=\"code\">{c}</span>{}</p>",
                p.field
                    .as_ref()
                    .map(|f| format!(", field <span class=\"field\">{}</span>", esc(f)))
                    .unwrap_or_default()
            ));
        }
        body.push_str(&targets_table(&p.targets));
        if !p.dropped.is_empty() {
            body.push_str(&dropped_list(&p.dropped));
        }
        if let Some(r) = &p.rendered {
            body.push_str(&format!(
                "<h3>Would be written</h3><pre id=\"preview-file\">{}</pre>",
                esc(r)
            ));
        }
        body.push_str("</section>");
    }
    page(status, &title, Some(&s.csrf), &body)
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
    BindingInput {
        name: fs.name.clone(),
        plugin: plugin.to_string(),
        provider: decl.code.clone(),
        config,
        service: fs.service.clone(),
        interval_secs,
        directives: fs
            .directives
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
    }
}

pub(super) fn put_error(fs: &mut FormState, decl: &ProviderDecl, e: EngineError) {
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
}
