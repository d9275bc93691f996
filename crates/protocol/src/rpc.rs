use std::fmt;

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::ConfigMap;

/// The `jsonrpc` member of every message.
pub const JSONRPC_VERSION: &str = "2.0";

/// A JSON-RPC request or response id. The host always sends numbers; plugins echo the id unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    /// A non-negative integer id (what the host uses).
    Num(u64),
    /// A string id.
    Str(String),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<u64> for Id {
    fn from(n: u64) -> Self {
        Id::Num(n)
    }
}

/// The `"2.0"` marker: serialises as `"2.0"`, refuses anything else on input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Version;

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(JSONRPC_VERSION)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = String::deserialize(d)?;
        if v == JSONRPC_VERSION {
            Ok(Version)
        } else {
            Err(de::Error::custom(format!(
                "jsonrpc must be \"2.0\", got {v:?}"
            )))
        }
    }
}

/// A JSON-RPC 2.0 request: `{"jsonrpc":"2.0","id":..,"method":..,"params":..}`. `Debug` shows the
/// values of `params.config` as `<redacted>`.
#[derive(Clone, PartialEq)]
pub struct Request {
    pub id: Id,
    pub method: String,
    /// The params, kept raw; `Value::Null` when absent.
    pub params: Value,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut params = self.params.clone();
        if let Some(Value::Object(config)) = params.get_mut("config") {
            for v in config.values_mut() {
                *v = Value::String("<redacted>".into());
            }
        }
        f.debug_struct("Request")
            .field("id", &self.id)
            .field("method", &self.method)
            .field("params", &params)
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct RawRequest {
    jsonrpc: Version,
    id: Id,
    method: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    params: Value,
}

impl Request {
    /// A request with any params.
    pub fn new(id: impl Into<Id>, method: impl Into<String>, params: Value) -> Self {
        Self {
            id: id.into(),
            method: method.into(),
            params,
        }
    }

    /// A `discovery.resolve` request.
    pub fn resolve(id: impl Into<Id>, params: &ResolveParams) -> Self {
        // ResolveParams holds only strings and JSON values: serialising it cannot fail.
        let params = serde_json::to_value(params).unwrap_or(Value::Null);
        Self::new(id, crate::RESOLVE_METHOD, params)
    }
}

impl Serialize for Request {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RawRequest {
            jsonrpc: Version,
            id: self.id.clone(),
            method: self.method.clone(),
            params: self.params.clone(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawRequest::deserialize(d)?;
        Ok(Request {
            id: raw.id,
            method: raw.method,
            params: raw.params,
        })
    }
}

/// A JSON-RPC error object. `data.field` names the config key at fault for [`crate::ERR_CONFIG`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a code and a message, no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// `-32003`: a cause in the configuration; `field` is the config key at fault (or `"service"`).
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: crate::ERR_CONFIG,
            message: message.into(),
            data: Some(serde_json::json!({ "field": field.into() })),
        }
    }

    /// `-32000`: any other failure of the provider.
    pub fn provider(message: impl Into<String>) -> Self {
        Self::new(crate::ERR_PROVIDER, message)
    }

    /// `data.field`, when `data` is an object with a string `field`.
    pub fn field(&self) -> Option<&str> {
        self.data.as_ref()?.get("field")?.as_str()
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {}", self.message, self.code)?;
        if let Some(field) = self.field() {
            write!(f, ", field {field:?}")?;
        }
        write!(f, ")")
    }
}

impl std::error::Error for RpcError {}

/// What a response carries: exactly one of `result` and `error`.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponsePayload {
    Result(Value),
    Error(RpcError),
}

/// A JSON-RPC 2.0 response. `id` is `None` only for errors about an unreadable request (`"id": null`).
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub id: Option<Id>,
    pub payload: ResponsePayload,
}

#[derive(Serialize, Deserialize)]
struct RawResponse {
    jsonrpc: Version,
    #[serde(default)]
    id: Option<Id>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<RpcError>,
}

/// Distinguishes `"result": null` (present) from an absent `result`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl Response {
    /// A successful response.
    pub fn result(id: impl Into<Id>, result: Value) -> Self {
        Self {
            id: Some(id.into()),
            payload: ResponsePayload::Result(result),
        }
    }

    /// An error response (`id` `None` for an unreadable request).
    pub fn error(id: Option<Id>, error: RpcError) -> Self {
        Self {
            id,
            payload: ResponsePayload::Error(error),
        }
    }

    /// The payload as a `Result`.
    pub fn into_result(self) -> Result<Value, RpcError> {
        match self.payload {
            ResponsePayload::Result(v) => Ok(v),
            ResponsePayload::Error(e) => Err(e),
        }
    }
}

impl Serialize for Response {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (result, error) = match &self.payload {
            ResponsePayload::Result(v) => (Some(v.clone()), None),
            ResponsePayload::Error(e) => (None, Some(e.clone())),
        };
        RawResponse {
            jsonrpc: Version,
            id: self.id.clone(),
            result,
            error,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Response {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawResponse::deserialize(d)?;
        let payload = match (raw.result, raw.error) {
            (Some(v), None) => ResponsePayload::Result(v),
            (None, Some(e)) => ResponsePayload::Error(e),
            (Some(_), Some(_)) => {
                return Err(de::Error::custom("response has both `result` and `error`"))
            }
            (None, None) => {
                return Err(de::Error::custom(
                    "response has neither `result` nor `error`",
                ))
            }
        };
        Ok(Response {
            id: raw.id,
            payload,
        })
    }
}

/// Params of `discovery.resolve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolveParams {
    /// The provider code (from the manifest).
    pub provider: String,
    /// The provider config; every value is secret.
    pub config: ConfigMap,
    /// The service in the provider's own terms.
    pub service: String,
}

/// Result of `discovery.resolve`. `targets` stay raw JSON values: validating them is the caller's job
/// (one bad target is dropped, it does not fail the answer). A result without a `targets` array is
/// malformed; `ttl_seconds` defaults to 0 (leave it to the interval).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolveResult {
    pub targets: Vec<Value>,
    #[serde(default)]
    pub ttl_seconds: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_needs_exactly_one_of_result_and_error() {
        let both = r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}"#;
        assert!(serde_json::from_str::<Response>(both)
            .unwrap_err()
            .to_string()
            .contains("both"));
        let none = r#"{"jsonrpc":"2.0","id":1}"#;
        assert!(serde_json::from_str::<Response>(none)
            .unwrap_err()
            .to_string()
            .contains("neither"));
        let null_result = r#"{"jsonrpc":"2.0","id":1,"result":null}"#;
        let r: Response = serde_json::from_str(null_result).unwrap();
        assert_eq!(r.payload, ResponsePayload::Result(Value::Null));
    }

    #[test]
    fn request_debug_redacts_config_values() {
        let mut config = ConfigMap::new();
        config.insert("token", "tok_live_secret");
        let req = Request::resolve(
            1,
            &ResolveParams {
                provider: "p".into(),
                config,
                service: "api".into(),
            },
        );
        let dbg = format!("{req:?}");
        assert!(!dbg.contains("tok_live_secret"), "{dbg}");
        assert!(dbg.contains("token") && dbg.contains("api"), "{dbg}");
    }

    #[test]
    fn version_must_be_2_0() {
        let bad = r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#;
        let err = serde_json::from_str::<Request>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("2.0"), "{err}");
    }

    #[test]
    fn rpc_error_field() {
        let e = RpcError::config("token", "token rejected");
        assert_eq!(e.field(), Some("token"));
        assert_eq!(
            e.to_string(),
            "token rejected (code -32003, field \"token\")"
        );
        assert_eq!(RpcError::provider("down").field(), None);
        let odd = RpcError {
            code: -32003,
            message: "m".into(),
            data: Some(serde_json::json!({"field": 5})),
        };
        assert_eq!(odd.field(), None);
    }

    #[test]
    fn result_without_targets_is_malformed() {
        let err = serde_json::from_str::<ResolveResult>(r#"{"ttl_seconds":3}"#).unwrap_err();
        assert!(err.to_string().contains("targets"), "{err}");
        let ok: ResolveResult = serde_json::from_str(r#"{"targets":[{"port":"80"}]}"#).unwrap();
        assert_eq!(ok.ttl_seconds, 0);
        assert_eq!(ok.targets.len(), 1);
    }
}
