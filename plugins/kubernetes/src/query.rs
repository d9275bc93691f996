//! What a request asks for: the API server, the namespace and the Service by name or label
//! selector, the port name; read from the config and `service`.

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use reqwest::Url;
use tributary_plugin_sdk::{ConfigExt, ResolveParams, RpcError};

/// What the service names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    /// A Service by name.
    Name(String),
    /// Services matching a label selector.
    Selector(String),
}

#[derive(Debug)]
pub(crate) struct Query {
    pub(crate) base: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) has_token: bool,
    pub(crate) ca_cert: Option<String>,
    pub(crate) namespace: String,
    pub(crate) selection: Selection,
    pub(crate) port_name: Option<String>,
}

impl Query {
    pub(crate) fn from_params(params: &ResolveParams) -> Result<Query, RpcError> {
        let c = &params.config;
        let base = parse_api_server(c.required_str("api_server")?)?;
        let token = c.optional_str("token")?;
        let ca_cert = c.optional_str("ca_cert")?.map(str::to_string);
        let default_ns = c.optional_str("namespace")?.unwrap_or("default");
        if !is_dns_label(default_ns) {
            return Err(RpcError::config(
                "namespace",
                "namespace must be a DNS label (lower-case letters, digits and `-`, at most 63)",
            ));
        }
        let port_name = c.optional_str("port_name")?.map(str::to_string);
        let mut headers = HeaderMap::new();
        if let Some(t) = token {
            let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                RpcError::config(
                    "token",
                    "token holds characters that cannot travel in an HTTP header",
                )
            })?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let (namespace, selection) = parse_service(&params.service, default_ns)?;
        Ok(Query {
            base,
            headers,
            has_token: token.is_some(),
            ca_cert,
            namespace,
            selection,
            port_name,
        })
    }

    pub(crate) fn label_selector(&self) -> String {
        match &self.selection {
            Selection::Name(n) => format!("kubernetes.io/service-name={n}"),
            Selection::Selector(s) => s.clone(),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match &self.selection {
            Selection::Name(n) => format!("service {n:?} in namespace {:?}", self.namespace),
            Selection::Selector(s) => {
                format!("selector {s:?} in namespace {:?}", self.namespace)
            }
        }
    }
}

pub(crate) fn parse_api_server(text: &str) -> Result<Url, RpcError> {
    let url = Url::parse(text).map_err(|_| {
        RpcError::config(
            "api_server",
            "api_server must be the API server's URL, such as https://10.0.0.1:6443",
        )
    })?;
    if url.scheme() != "https" {
        return Err(RpcError::config(
            "api_server",
            "api_server must be an https:// URL (the token is never sent in clear text)",
        ));
    }
    if url.host_str().is_none_or(str::is_empty)
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(RpcError::config(
            "api_server",
            "api_server must be a plain https://host[:port][/path] URL without credentials or query",
        ));
    }
    Ok(url)
}

/// RFC 1123 label: what namespaces and Service names are.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `name`, `namespace/name`, or a label selector (anything with `=` or `!`, or a bare key test).
pub(crate) fn parse_service(
    service: &str,
    default_ns: &str,
) -> Result<(String, Selection), RpcError> {
    let s = service.trim();
    if s.contains('=') || s.contains('!') || s.contains(',') {
        if s.contains(char::is_control) {
            return Err(RpcError::config(
                "service",
                "the label selector holds control characters",
            ));
        }
        return Ok((default_ns.to_string(), Selection::Selector(s.to_string())));
    }
    let (ns, name) = match s.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (default_ns, s),
    };
    if !is_dns_label(ns) || !is_dns_label(name) {
        return Err(RpcError::config(
            "service",
            "service must be a Service name, namespace/name, or a label selector such as app=web",
        ));
    }
    Ok((ns.to_string(), Selection::Name(name.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services() {
        assert_eq!(
            parse_service("web", "prod").unwrap(),
            ("prod".into(), Selection::Name("web".into()))
        );
        assert_eq!(
            parse_service("shop/web", "prod").unwrap(),
            ("shop".into(), Selection::Name("web".into()))
        );
        assert_eq!(
            parse_service("app=web,tier!=db", "prod").unwrap(),
            (
                "prod".into(),
                Selection::Selector("app=web,tier!=db".into())
            )
        );
        for bad in ["", "Web", "a/b/c", "/web", "shop/", "we b", "-x"] {
            assert_eq!(
                parse_service(bad, "default").unwrap_err().field(),
                Some("service"),
                "{bad}"
            );
        }
    }

    #[test]
    fn api_server_must_be_https() {
        assert!(parse_api_server("https://127.0.0.1:6443").is_ok());
        assert!(parse_api_server("https://k8s.example/proxy/c1").is_ok());
        for bad in [
            "http://127.0.0.1:6443",
            "127.0.0.1:6443",
            "https://u:p@h",
            "https://h/?a=1",
        ] {
            assert_eq!(
                parse_api_server(bad).unwrap_err().field(),
                Some("api_server"),
                "{bad}"
            );
        }
    }
}
