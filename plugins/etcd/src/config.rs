//! A request's configuration: endpoints, prefix, credentials, CA, read and checked; and the
//! scrubbing of endpoint hosts and credentials out of error messages.

use tributary_plugin_sdk::{ConfigExt, ResolveParams, RpcError};

pub(crate) struct Config {
    pub(crate) endpoints: Vec<reqwest::Url>,
    /// The raw endpoint texts, for scrubbing messages.
    pub(crate) endpoint_texts: Vec<String>,
    pub(crate) service: String,
    pub(crate) base: String,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) ca_cert: Option<String>,
}

impl Config {
    pub(crate) fn parse(params: &ResolveParams) -> Result<Config, RpcError> {
        let c = &params.config;
        let list = c.required_str("endpoints")?;
        let mut endpoints = Vec::new();
        let mut endpoint_texts = Vec::new();
        for (i, text) in list
            .split(|ch: char| ch == ',' || ch.is_whitespace())
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            let bad =
                |why: &str| RpcError::config("endpoints", format!("endpoint {}: {why}", i + 1));
            let url = reqwest::Url::parse(text).map_err(|_| {
                bad("is not a URL (expected http://host:port or https://host:port)")
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(bad("must start with http:// or https://"));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(bad("has no host"));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(bad(
                    "must not carry credentials (use the username and password fields)",
                ));
            }
            if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
                return Err(bad("must be scheme://host:port without a path or query"));
            }
            endpoints.push(url);
            endpoint_texts.push(text.to_string());
        }
        if endpoints.is_empty() {
            return Err(RpcError::config("endpoints", "endpoints lists no URL"));
        }
        let mut prefix = c
            .optional_str("prefix")?
            .unwrap_or("/services/")
            .to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let service = params.service.clone();
        if service.is_empty()
            || service.starts_with('/')
            || service.ends_with('/')
            || service.chars().any(char::is_control)
        {
            return Err(RpcError::config(
                "service",
                "service must be a key name under the prefix: not empty, no leading or trailing /, no control characters",
            ));
        }
        let credentials = match (c.optional_str("username")?, c.optional_str("password")?) {
            (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(RpcError::config(
                    "password",
                    "password is required when username is set",
                ))
            }
            (None, Some(_)) => {
                return Err(RpcError::config(
                    "username",
                    "username is required when password is set",
                ))
            }
        };
        Ok(Config {
            base: format!("{prefix}{service}"),
            endpoints,
            endpoint_texts,
            service,
            credentials,
            ca_cert: c.optional_str("ca_cert")?.map(str::to_string),
        })
    }

    /// Replaces endpoint URLs, host:port pairs and host names in `msg` by "endpoint N": every
    /// config value is secret, and library errors may quote a host.
    pub(crate) fn scrub(&self, msg: &str) -> String {
        let mut out = msg.to_string();
        for (i, (url, text)) in self.endpoints.iter().zip(&self.endpoint_texts).enumerate() {
            let name = format!("endpoint {}", i + 1);
            let host = url.host_str().unwrap_or_default().to_string();
            let host_port = match url.port() {
                Some(p) => format!("{host}:{p}"),
                None => host.clone(),
            };
            for needle in [
                text.as_str(),
                url.as_str(),
                host_port.as_str(),
                host.as_str(),
            ] {
                if needle.len() >= 3 {
                    out = out.replace(needle, &name);
                }
            }
        }
        if let Some((user, pass)) = &self.credentials {
            for needle in [pass, user] {
                if !needle.is_empty() {
                    out = out.replace(needle.as_str(), "<redacted>");
                }
            }
        }
        out
    }

    pub(crate) fn scrub_error(&self, mut e: RpcError) -> RpcError {
        e.message = self.scrub(&e.message);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use tributary_plugin_sdk::{ConfigMap, ERR_CONFIG};

    fn params(config: Value, service: &str) -> ResolveParams {
        ResolveParams {
            provider: "etcd".into(),
            config: serde_json::from_value::<ConfigMap>(config).unwrap(),
            service: service.into(),
        }
    }

    #[test]
    fn config_errors_name_their_field_and_not_the_value() {
        for (config, service, field) in [
            (json!({}), "api", "endpoints"),
            (json!({"endpoints": " , "}), "api", "endpoints"),
            (json!({"endpoints": "127.0.0.1:2379"}), "api", "endpoints"),
            (
                json!({"endpoints": "ftp://127.0.0.1:2379"}),
                "api",
                "endpoints",
            ),
            (
                json!({"endpoints": "http://u:pw@127.0.0.1:2379"}),
                "api",
                "endpoints",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379/v3"}),
                "api",
                "endpoints",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379", "username": "u"}),
                "api",
                "password",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379", "password": "p4ss"}),
                "api",
                "username",
            ),
            (json!({"endpoints": "http://127.0.0.1:2379"}), "", "service"),
            (
                json!({"endpoints": "http://127.0.0.1:2379"}),
                "/api",
                "service",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379"}),
                "a\nb",
                "service",
            ),
        ] {
            let e = Config::parse(&params(config.clone(), service))
                .err()
                .unwrap();
            assert_eq!(
                (e.code, e.field()),
                (ERR_CONFIG, Some(field)),
                "{config}: {}",
                e.message
            );
            assert!(!e.message.contains("127.0.0.1"), "{}", e.message);
            assert!(!e.message.contains("p4ss"), "{}", e.message);
        }
        let c = Config::parse(&params(
            json!({"endpoints": "http://127.0.0.1:2379, https://etcd.example:2379/", "prefix": "/reg"}),
            "api/v1",
        ))
        .unwrap();
        assert_eq!(c.base, "/reg/api/v1");
        assert_eq!(c.endpoints.len(), 2);
    }

    #[test]
    fn scrub_removes_hosts_and_credentials() {
        let c = Config::parse(&params(
            json!({"endpoints": "https://etcd-1.example:2379 http://10.1.2.3:2379", "username": "svc-user", "password": "hunter22"}),
            "api",
        ))
        .unwrap();
        let s = c.scrub(
            "cert not valid for \"etcd-1.example\"; 10.1.2.3:2379 refused; svc-user/hunter22",
        );
        assert_eq!(
            s,
            "cert not valid for \"endpoint 1\"; endpoint 2 refused; <redacted>/<redacted>"
        );
    }
}
