//! The body of `POST .../servers` and `PATCH .../servers/ID`: one server's fields as Plus names
//! them (`server`, `weight`, `max_conns`, `max_fails`, `fail_timeout`, `slow_start`, `route`,
//! `backup`, `down`, `drain`, `id`, `service`), each checked with Plus's error code. What this
//! module cannot do is refused, never ignored: a host name in `server` (live changes take
//! addresses), a per-server `slow_start` other than 0, a `route`, a `service`.

use serde_json::{Map, Value};

use super::{time, PlusError};
use crate::live::{Addr, MAX_WEIGHT};

/// The fields a body gives (absent: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerFields {
    /// `server`: the address (an IP address without a port gets port 80, as in nginx).
    pub server: Option<Addr>,
    /// `weight`
    pub weight: Option<u32>,
    /// `max_conns`
    pub max_conns: Option<u32>,
    /// `max_fails`
    pub max_fails: Option<u32>,
    /// `fail_timeout` in whole seconds.
    pub fail_timeout_s: Option<u32>,
    /// `backup`
    pub backup: Option<bool>,
    /// `down`
    pub down: Option<bool>,
    /// `drain`
    pub drain: Option<bool>,
    /// `id` (read-only: a `PATCH` may repeat the server's own).
    pub id: Option<u64>,
}

fn format_error(text: impl Into<String>) -> PlusError {
    PlusError::new(400, "UpstreamConfFormatError", text)
}

/// Parses a body. Errors: 415 `JsonError` (not JSON), 400 with Plus's code for the field.
pub fn parse(body: &[u8]) -> Result<ServerFields, PlusError> {
    if body.len() > super::MAX_BODY {
        return Err(PlusError::new(
            413,
            "BodyTooLarge",
            format!("request body larger than {} bytes", super::MAX_BODY),
        ));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| PlusError::new(415, "JsonError", format!("JSON error: {e}")))?;
    let Value::Object(map) = v else {
        return Err(format_error(
            "the body must be a JSON object of server parameters",
        ));
    };
    fields(&map)
}

fn fields(map: &Map<String, Value>) -> Result<ServerFields, PlusError> {
    let mut f = ServerFields::default();
    for (key, value) in map {
        if value.is_object() || value.is_array() {
            return Err(format_error(format!("nested object or list in \"{key}\"")));
        }
        match key.as_str() {
            "server" => f.server = Some(address(value)?),
            "weight" => {
                f.weight = Some(
                    int(value)
                        .filter(|w| (1..=u64::from(MAX_WEIGHT)).contains(w))
                        .map(|w| w as u32)
                        .ok_or_else(|| bad("weight", "UpstreamBadWeight", value))?,
                )
            }
            "max_conns" => f.max_conns = Some(u32_of(value, "max_conns", "UpstreamBadMaxConns")?),
            "max_fails" => f.max_fails = Some(u32_of(value, "max_fails", "UpstreamBadMaxFails")?),
            "fail_timeout" => f.fail_timeout_s = Some(fail_timeout(value)?),
            "slow_start" => slow_start(value)?,
            "route" => {
                if value.as_str() != Some("") {
                    return Err(PlusError::new(
                        400,
                        "UpstreamBadRoute",
                        "\"route\" is not supported: this module has no sticky routes (send \"\" or leave it out)",
                    ));
                }
            }
            "service" => return Err(PlusError::new(
                400,
                "UpstreamBadService",
                "\"service\" is not supported: live changes take addresses, not names to resolve",
            )),
            "backup" => f.backup = Some(boolean(value, key)?),
            "down" => f.down = Some(boolean(value, key)?),
            "drain" => f.drain = Some(boolean(value, key)?),
            "id" => {
                f.id = Some(int(value).ok_or_else(|| {
                    PlusError::new(
                        400,
                        "UpstreamBadServerId",
                        format!("invalid server ID {value}"),
                    )
                })?)
            }
            other => return Err(format_error(format!("unknown parameter \"{other}\""))),
        }
    }
    Ok(f)
}

fn bad(field: &str, code: &'static str, value: &Value) -> PlusError {
    PlusError::new(400, code, format!("invalid \"{field}\" value {value}"))
}

fn int(v: &Value) -> Option<u64> {
    v.as_u64()
}

fn u32_of(v: &Value, field: &str, code: &'static str) -> Result<u32, PlusError> {
    int(v)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(field, code, v))
}

fn boolean(v: &Value, field: &str) -> Result<bool, PlusError> {
    v.as_bool()
        .ok_or_else(|| format_error(format!("invalid \"{field}\" value {v}: true or false")))
}

/// `fail_timeout`: nginx's time syntax (`"10s"`) or a number of seconds; whole seconds (nginx
/// keeps seconds).
fn fail_timeout(v: &Value) -> Result<u32, PlusError> {
    let ms = match v {
        Value::String(s) => time::parse_ms(s),
        Value::Number(_) => int(v).and_then(|n| n.checked_mul(1000)),
        _ => None,
    };
    ms.filter(|ms| ms % 1000 == 0)
        .and_then(|ms| u32::try_from(ms / 1000).ok())
        .ok_or_else(|| {
            PlusError::new(
                400,
                "UpstreamBadFailTimeout",
                format!(
                    "invalid \"fail_timeout\" value {v}: a time in whole seconds such as \"10s\""
                ),
            )
        })
}

/// `slow_start`: only 0 (this module ramps servers per upstream, with `probe ... slow_start=`).
fn slow_start(v: &Value) -> Result<(), PlusError> {
    let ms = match v {
        Value::String(s) => time::parse_ms(s),
        Value::Number(_) => int(v),
        _ => None,
    };
    match ms {
        Some(0) => Ok(()),
        _ => Err(PlusError::new(
            400,
            "UpstreamBadSlowStart",
            format!("invalid \"slow_start\" value {v}: only 0 is supported (per-server slow start is not; \"probe ... slow_start=\" ramps the servers of an upstream)"),
        )),
    }
}

/// `server`: `IP:PORT`, `[IPv6]:PORT`, an IP address alone (port 80) or `unix:/path`.
fn address(v: &Value) -> Result<Addr, PlusError> {
    let Some(text) = v.as_str() else {
        return Err(PlusError::new(
            400,
            "UpstreamBadAddress",
            format!("invalid \"server\" value {v}"),
        ));
    };
    let with_port = if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        std::net::SocketAddr::new(ip, 80).to_string()
    } else if text.starts_with('[') && text.ends_with(']') {
        format!("{text}:80")
    } else {
        text.to_string()
    };
    Addr::parse(&with_port).map_err(|e| PlusError::new(400, "UpstreamBadAddress", e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<ServerFields, PlusError> {
        parse(s.as_bytes())
    }

    #[test]
    fn every_field_parses() {
        let f = p(
            r#"{"server":"10.0.0.1:8080","weight":5,"max_conns":7,"max_fails":3,
            "fail_timeout":"1m","slow_start":"0s","route":"","backup":true,"down":false,
            "drain":true,"id":4}"#,
        )
        .unwrap();
        assert_eq!(f.server, Some(Addr::Inet("10.0.0.1:8080".parse().unwrap())));
        assert_eq!(f.weight, Some(5));
        assert_eq!(f.max_conns, Some(7));
        assert_eq!(f.max_fails, Some(3));
        assert_eq!(f.fail_timeout_s, Some(60));
        assert_eq!(
            (f.backup, f.down, f.drain, f.id),
            (Some(true), Some(false), Some(true), Some(4))
        );
        assert_eq!(p("{}").unwrap(), ServerFields::default());
        assert_eq!(
            p(r#"{"fail_timeout":20}"#).unwrap().fail_timeout_s,
            Some(20)
        );
        assert_eq!(p(r#"{"slow_start":0}"#).unwrap(), ServerFields::default());
    }

    #[test]
    fn addresses_take_port_80_by_default_and_refuse_names() {
        let a = |s: &str| p(&format!(r#"{{"server":"{s}"}}"#)).map(|f| f.server.unwrap().name());
        assert_eq!(a("10.0.0.1").unwrap(), "10.0.0.1:80");
        assert_eq!(a("::1").unwrap(), "[::1]:80");
        assert_eq!(a("[::1]").unwrap(), "[::1]:80");
        assert_eq!(a("[::1]:81").unwrap(), "[::1]:81");
        assert_eq!(a("unix:/run/a.sock").unwrap(), "unix:/run/a.sock");
        for bad in [
            "backend.example.com:80",
            "backend",
            "10.0.0.1:0",
            "0.0.0.0:80",
            "",
        ] {
            let e = a(bad).unwrap_err();
            assert_eq!((e.status, e.code), (400, "UpstreamBadAddress"), "{bad}");
        }
        assert_eq!(p(r#"{"server":5}"#).unwrap_err().code, "UpstreamBadAddress");
    }

    #[test]
    fn bad_values_have_plus_codes() {
        for (body, status, code) in [
            ("not json", 415, "JsonError"),
            ("[1]", 400, "UpstreamConfFormatError"),
            (r#"{"nope":1}"#, 400, "UpstreamConfFormatError"),
            (r#"{"weight":{"a":1}}"#, 400, "UpstreamConfFormatError"),
            (r#"{"weight":[1]}"#, 400, "UpstreamConfFormatError"),
            (r#"{"weight":0}"#, 400, "UpstreamBadWeight"),
            (r#"{"weight":1000001}"#, 400, "UpstreamBadWeight"),
            (r#"{"weight":"5"}"#, 400, "UpstreamBadWeight"),
            (r#"{"weight":-1}"#, 400, "UpstreamBadWeight"),
            (r#"{"max_conns":-1}"#, 400, "UpstreamBadMaxConns"),
            (r#"{"max_conns":4294967296}"#, 400, "UpstreamBadMaxConns"),
            (r#"{"max_fails":1.5}"#, 400, "UpstreamBadMaxFails"),
            (r#"{"fail_timeout":"500ms"}"#, 400, "UpstreamBadFailTimeout"),
            (r#"{"fail_timeout":"soon"}"#, 400, "UpstreamBadFailTimeout"),
            (r#"{"fail_timeout":true}"#, 400, "UpstreamBadFailTimeout"),
            (r#"{"slow_start":"10s"}"#, 400, "UpstreamBadSlowStart"),
            (r#"{"route":"a"}"#, 400, "UpstreamBadRoute"),
            (r#"{"service":"http"}"#, 400, "UpstreamBadService"),
            (r#"{"down":"yes"}"#, 400, "UpstreamConfFormatError"),
            (r#"{"drain":1}"#, 400, "UpstreamConfFormatError"),
            (r#"{"id":"x"}"#, 400, "UpstreamBadServerId"),
        ] {
            let e = p(body).unwrap_err();
            assert_eq!((e.status, e.code), (status, code), "{body}: {}", e.text);
        }
        let big = format!(r#"{{"server":"{}"}}"#, "x".repeat(crate::plus::MAX_BODY));
        assert_eq!(p(&big).unwrap_err().status, 413);
    }
}
