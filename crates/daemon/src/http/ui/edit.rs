//! The handlers of the create and edit pages: provider choice, form, submit.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::html;
use serde::Deserialize;
use serde_json::Value;
use tributary_protocol::FieldType;

use super::detail::engine_page;
use super::form::{input_from_form, put_error, render_form, FormState};
use super::html::page;
use super::{check_csrf, form, get_field, urlencode};
use crate::engine::EngineError;
use crate::http::api::resolve::preview;
use crate::http::auth::session::Session;
use crate::http::AppState;
use crate::view::BindingView;

#[derive(Debug, Deserialize)]
pub(super) struct NewQuery {
    pub(super) plugin: Option<String>,
    pub(super) provider: Option<String>,
}

pub(super) fn provider_choice(st: &AppState, s: &Session) -> Response {
    let plugins = st.engine.host().plugins();
    let body = html! {
        h1 { "New binding" }
        p { "Choose a provider:" }
        ul.providers {
            @for p in &plugins {
                @for pr in p.manifest.providers() {
                    li {
                        a href={"/ui/new?plugin=" (urlencode(&p.name)) "&provider=" (urlencode(&pr.code))} {
                            (pr.name) " — " (pr.code)
                        }
                        " " small { "(" (p.name) " " (p.version) ")" }
                    }
                }
            }
        }
    };
    page(StatusCode::OK, "New binding", Some(&s.csrf), body)
}

pub(super) async fn new_form(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Query(q): Query<NewQuery>,
) -> Response {
    let (Some(plugin), Some(provider)) = (q.plugin, q.provider) else {
        return provider_choice(&st, &s);
    };
    let Some(decl) = st.engine.host().provider(&plugin, &provider) else {
        return page(
            StatusCode::NOT_FOUND,
            "New binding",
            Some(&s.csrf),
            html! { p.error { "No such plugin or provider. " a href="/ui/new" { "Choose one" } "." } },
        );
    };
    let mut fs = FormState::default();
    for f in &decl.configuration.fields {
        match (&f.default, f.field_type) {
            (Some(Value::Bool(true)), FieldType::Bool) => {
                fs.checked.insert(f.key.clone());
            }
            (Some(v), _) if !f.secret && f.field_type != FieldType::Bool => {
                let t = match v {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                fs.values.insert(f.key.clone(), t);
            }
            _ => {}
        }
    }
    render_form(&s, &decl, &plugin, None, &fs, StatusCode::OK)
}

pub(super) async fn submit(
    st: &AppState,
    s: &Session,
    body: &Bytes,
    edit: Option<BindingView>,
) -> Response {
    let f = match form(body) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    if let Err(r) = check_csrf(s, &f) {
        return *r;
    }
    let plugin = get_field(&f, "plugin").unwrap_or("").to_string();
    let provider = get_field(&f, "provider").unwrap_or("").to_string();
    let Some(decl) = st.engine.host().provider(&plugin, &provider) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Bad request",
            Some(&s.csrf),
            html! { p.error { "No such plugin or provider." } },
        );
    };
    let mut fs = FormState::default();
    let input = input_from_form(&decl, &plugin, &f, &mut fs);
    let path_name = edit.as_ref().map(|b| b.name.as_str());
    if !fs.errors.is_empty() {
        // The form could not be read whole: show the other fields' problems with it.
        if let Err(e) = st.engine.preview_binding(&input, path_name) {
            let _ = put_error(&mut fs, &decl, e);
        }
        return render_form(
            s,
            &decl,
            &plugin,
            edit.as_ref(),
            &fs,
            StatusCode::BAD_REQUEST,
        );
    }
    if get_field(&f, "action") == Some("test") {
        match preview(&st.engine, &input, path_name).await {
            Ok(p) => {
                fs.preview = Some(p);
                return render_form(s, &decl, &plugin, edit.as_ref(), &fs, StatusCode::OK);
            }
            Err(e) => {
                let status = put_error(&mut fs, &decl, e);
                return render_form(s, &decl, &plugin, edit.as_ref(), &fs, status);
            }
        }
    }
    let engine = &st.engine;
    let saved = match path_name {
        Some(n) => engine
            .put(n, &input)
            .await
            .map(|(u, v)| (u != tributary_store::Upsert::Unchanged, v.name)),
        None => engine.add(&input).await.map(|v| (true, v.name)),
    };
    match saved {
        Ok((changed, name)) => {
            if changed {
                // Show the page after the first resolution of the saved binding.
                let _ = engine.wait_first(&name).await;
            }
            Redirect::to(&format!("/ui/bindings/{}", urlencode(&name))).into_response()
        }
        Err(e) => {
            let status = put_error(&mut fs, &decl, e);
            render_form(s, &decl, &plugin, edit.as_ref(), &fs, status)
        }
    }
}

pub(super) async fn new_submit(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    body: Bytes,
) -> Response {
    submit(&st, &s, &body, None).await
}

pub(super) async fn edit_form(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    let Some(b) = st.engine.get(&name) else {
        return engine_page(&s, EngineError::NotFound(name));
    };
    let Some(decl) = st.engine.host().provider(&b.plugin, &b.provider) else {
        return page(
            StatusCode::CONFLICT,
            "Edit",
            Some(&s.csrf),
            html! { p.error { "The binding's plugin or provider is not loaded." } },
        );
    };
    let mut fs = FormState {
        name: b.name.clone(),
        service: b.service.clone(),
        interval: b.interval_secs.to_string(),
        directives: b.directives.join("\n"),
        probe: b.probe.clone().unwrap_or_default(),
        drain_secs: if b.drain_secs > 0 {
            b.drain_secs.to_string()
        } else {
            String::new()
        },
        ..FormState::default()
    };
    for (k, v) in &b.config {
        match v {
            Value::Bool(true) => {
                fs.checked.insert(k.clone());
            }
            Value::Bool(false) => {}
            Value::String(t) => {
                fs.values.insert(k.clone(), t.clone());
            }
            v => {
                fs.values.insert(k.clone(), v.to_string());
            }
        }
    }
    let plugin = b.plugin.clone();
    render_form(&s, &decl, &plugin, Some(&b), &fs, StatusCode::OK)
}

pub(super) async fn edit_submit(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let Some(b) = st.engine.get(&name) else {
        return engine_page(&s, EngineError::NotFound(name));
    };
    submit(&st, &s, &body, Some(b)).await
}
