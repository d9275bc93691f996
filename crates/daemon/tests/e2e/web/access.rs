//! Access control over real HTTP: health open, the API behind the bearer token, the UI behind a
//! session with CSRF, `/metrics` with either.

use crate::common::Daemon;
use serde_json::json;

use super::{bearer, nginx_with_backend, request};

#[test]
fn access_control_health_open_api_bearer_ui_session_metrics_either() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start(root.path(), &nginx);
    let tok = bearer(&d);
    assert_eq!(
        request(d.port, "GET", "/api/v1/health", &[], "").status,
        200
    );
    for p in [
        "/api/v1/bindings",
        "/api/v1/nginx",
        "/api/v1/openapi.json",
        "/api/v1/bindings/x/history",
        "/metrics",
    ] {
        let a = request(d.port, "GET", p, &[], "");
        assert_eq!(a.status, 401, "{p} without a token");
        assert_eq!(a.header("www-authenticate"), Some("Bearer"), "{p}");
        let a = request(
            d.port,
            "GET",
            p,
            &[("Authorization", "Bearer wrong-token-wrong-token")],
            "",
        );
        assert_eq!(a.status, 401, "{p} with a wrong token");
    }
    let a = request(d.port, "POST", "/api/v1/resolve", &[], "{}");
    assert_eq!(a.status, 401);
    // UI pages redirect to the login page; so does a POST without a session.
    for (m, p) in [
        ("GET", "/ui/bindings"),
        ("GET", "/ui/new"),
        ("GET", "/ui/nginx"),
        ("POST", "/ui/new"),
        ("POST", "/ui/bindings/x/delete"),
    ] {
        let a = request(d.port, m, p, &[], "");
        assert_eq!(a.status, 303, "{m} {p}");
        assert_eq!(a.header("location"), Some("/login"), "{m} {p}");
    }
    // The bearer token does not open the UI (it is for the API).
    let a = request(
        d.port,
        "GET",
        "/ui/bindings",
        &[("Authorization", &tok)],
        "",
    );
    assert_eq!(a.status, 303);

    // Login: CSRF double-submit token, wrong password, right password.
    let form = request(d.port, "GET", "/login", &[], "");
    assert_eq!(form.status, 200);
    let csp = form.header("content-security-policy").unwrap_or("");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let login_cookie = form
        .headers_named("set-cookie")
        .into_iter()
        .find(|c| c.starts_with("tributary_login="))
        .expect("login cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let csrf = login_cookie.split_once('=').unwrap().1.to_string();
    assert!(form.text().contains(&csrf));
    let password = std::fs::read_to_string(d.data_dir.join("ui-initial-password")).unwrap();
    let password = password.trim();
    let post = |cookie: &str, body: String| {
        request(
            d.port,
            "POST",
            "/login",
            &[
                ("Cookie", cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &body,
        )
    };
    let a = post(
        &login_cookie,
        format!("csrf={csrf}&password=wrong-password"),
    );
    assert_eq!(a.status, 401);
    assert!(a.text().contains("Wrong password."));
    let a = post("", format!("csrf={csrf}&password={password}"));
    assert_eq!(a.status, 403, "a login without the CSRF cookie is refused");
    let a = post(&login_cookie, format!("csrf={csrf}&password={password}"));
    assert_eq!(a.status, 303, "{}", a.text());
    let set = a
        .headers_named("set-cookie")
        .into_iter()
        .find(|c| c.starts_with("tributary_session="))
        .expect("session cookie")
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let session = set.split(';').next().unwrap().to_string();

    let page = request(d.port, "GET", "/ui/bindings", &[("Cookie", &session)], "");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let m = request(d.port, "GET", "/metrics", &[("Cookie", &session)], "");
    assert_eq!(m.status, 200);
    let m = request(d.port, "GET", "/metrics", &[("Authorization", &tok)], "");
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    assert!(
        m.text()
            .contains("# TYPE tributary_resolutions_total counter")
            && !m.text().contains("# EOF"),
        "{}",
        m.text()
    );
    // A scraper that asks for OpenMetrics gets it, with its content type.
    let om = request(
        d.port,
        "GET",
        "/metrics",
        &[
            ("Authorization", &tok),
            (
                "Accept",
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            ),
        ],
        "",
    );
    assert_eq!(om.status, 200);
    assert!(om
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    assert!(
        om.text().contains("# TYPE tributary_resolutions counter")
            && om.text().ends_with("# EOF\n"),
        "{}",
        om.text()
    );
    // A session does not open the JSON API.
    let a = request(
        d.port,
        "GET",
        "/api/v1/bindings",
        &[("Cookie", &session)],
        "",
    );
    assert_eq!(a.status, 401);

    // Forms need the session's CSRF token.
    let page_csrf = {
        let b = &page.text();
        let i = b.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
        b[i..i + 64].to_string()
    };
    let form_post = |path: &str, body: &str| {
        request(
            d.port,
            "POST",
            path,
            &[
                ("Cookie", &session),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body,
        )
    };
    let a = form_post(
        "/ui/new",
        "plugin=static&provider=static&name=x&service=demo&cfg.targets=127.0.0.1%3A80&action=save",
    );
    assert_eq!(a.status, 403, "no CSRF token");
    let a = form_post("/ui/new", "csrf=0000&plugin=static&provider=static&name=x&service=demo&cfg.targets=127.0.0.1%3A80&action=save");
    assert_eq!(a.status, 403, "wrong CSRF token");
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // Bad input through the form: each invalid field gets its message next to it; nothing saved.
    for (body, field, words) in [
        (
            "name=bad%20name&service=demo&cfg.targets=127.0.0.1%3A80",
            "name",
            "upstream name",
        ),
        (
            "name=ok&service=&cfg.targets=127.0.0.1%3A80",
            "service",
            "service",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&interval_secs=3",
            "interval_secs",
            "too short",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&interval_secs=x",
            "interval_secs",
            "whole number",
        ),
        ("name=ok&service=demo&cfg.targets=", "targets", "required"),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&cfg.ttl_seconds=abc",
            "ttl_seconds",
            "ttl_seconds",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&directives=include+%2Fetc%2Fpasswd%3B",
            "directives",
            "directive",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&probe=uri%3D%2Fhealthz",
            "probe",
            "live apply mode",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&drain_secs=soon",
            "drain_secs",
            "whole number",
        ),
    ] {
        let a = form_post(
            "/ui/new",
            &format!("csrf={page_csrf}&plugin=static&provider=static&action=save&{body}"),
        );
        assert_eq!(a.status, 400, "{body}: {}", a.text());
        let marker = format!("id=\"err-{field}\"");
        let text = a.text();
        let i = text
            .find(&marker)
            .unwrap_or_else(|| panic!("{body}: no error for {field}: {text}"));
        let msg = &text[i..text[i..].find("</span>").map_or(text.len(), |j| i + j)];
        assert!(msg.contains(words), "{body}: {msg}");
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // Several invalid fields at once: each gets its own message.
    let a = form_post(
        "/ui/new",
        &format!(
            "csrf={page_csrf}&plugin=static&provider=static&action=save&name=.bad&service=\
             &interval_secs=3&cfg.targets=&cfg.ttl_seconds=abc&directives=include+x%3B"
        ),
    );
    assert_eq!(a.status, 400);
    for field in [
        "name",
        "service",
        "interval_secs",
        "targets",
        "ttl_seconds",
        "directives",
    ] {
        assert!(
            a.text().contains(&format!("id=\"err-{field}\"")),
            "no error for {field}: {}",
            a.text()
        );
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // An interval that is not a number is reported with the other fields' problems.
    let a = form_post(
        "/ui/new",
        &format!(
            "csrf={page_csrf}&plugin=static&provider=static&action=save&name=ok&service=\
             &interval_secs=soon&cfg.targets=127.0.0.1%3A80"
        ),
    );
    assert_eq!(a.status, 400);
    assert!(a.text().contains("whole number"), "{}", a.text());
    assert!(a.text().contains("id=\"err-service\""), "{}", a.text());

    // Logout ends the session.
    let a = form_post("/logout", &format!("csrf={page_csrf}"));
    assert_eq!(a.status, 303);
    let a = request(d.port, "GET", "/ui/bindings", &[("Cookie", &session)], "");
    assert_eq!(a.status, 303);
}
