//! The JSON body ([`JsonBody`]) and `?wait=` ([`WaitQuery`]) extractors of the API. Their errors
//! are typed ([`BodyError`]): a member's path and what was expected, built from the values serde
//! hands a [`de::Error`] (`invalid_type`, `unknown_field`, ...), never from an error's text. The
//! answer names the member at fault in `field` (its path, e.g. `interval_secs` or
//! `bindings[1].service`) and never repeats a string value from the body.
//!
//! A body is read in two passes: the text into a `serde_json::Value` (syntax errors, and a member
//! given twice, which a `Value` would otherwise keep silently), then that value into the input
//! type through [`ValueDeserializer`], whose error type is [`BodyError`].

mod error;
mod value;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
pub use error::BodyError;
use value::strict_value;
pub use value::ValueDeserializer;

/// A refused body: the error and the path of the member at fault (`None`: the body as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyRejection {
    pub error: BodyError,
    pub field: Option<String>,
}

impl BodyRejection {
    /// The answer's message: names the member, never repeats a string value.
    pub fn message(&self) -> String {
        let at = self.field.as_deref().unwrap_or("the body");
        match &self.error {
            BodyError::Syntax(_) | BodyError::Other(_) => {
                format!("invalid JSON body: {}", self.error)
            }
            BodyError::InvalidType { expected } => {
                format!("invalid JSON body: invalid type for {at}: expected {expected}")
            }
            BodyError::InvalidValue { expected } => {
                format!("invalid JSON body: invalid value for {at}: expected {expected}")
            }
            e => format!("invalid JSON body: {e}"),
        }
    }
}

impl From<BodyRejection> for ApiError {
    fn from(r: BodyRejection) -> ApiError {
        ApiError::bad_request(r.message(), r.field)
    }
}

/// Parses a JSON request body into `T` (see the module's documentation).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, BodyRejection> {
    let value = strict_value(body)?;
    serde_path_to_error::deserialize(ValueDeserializer::<BodyError>::new(value)).map_err(|e| {
        let path = e.path().clone();
        let error = e.into_inner();
        let at = (path.iter().next().is_some()).then(|| path.to_string());
        // The path ends at an unknown member, but at the parent of a missing one.
        let field = match &error {
            BodyError::MissingField(name) | BodyError::DuplicateField(name) => Some(match at {
                Some(parent) => format!("{parent}.{name}"),
                None => name.to_string(),
            }),
            _ => at,
        };
        BodyRejection { error, field }
    })
}

/// A JSON request body as `T`; a body that does not fit is a `400` naming the member.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let body = Bytes::from_request(req, state).await.map_err(|e| {
            ApiError::new(
                e.status(),
                format!("the body could not be read: {}", e.body_text()),
                None,
            )
        })?;
        Ok(JsonBody(parse(&body)?))
    }
}

/// `?wait=true|false` of a save (anything else in the query string is ignored).
#[derive(Debug, Default, Clone, Copy)]
pub struct WaitQuery {
    pub wait: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for WaitQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        WaitQuery::parse(parts.uri.query().unwrap_or(""))
    }
}

impl WaitQuery {
    /// Reads `wait` from a query string: `true` or `false`, at most once.
    pub fn parse(query: &str) -> Result<WaitQuery, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
            .map_err(|_| ApiError::bad_request("the query string could not be read", None))?;
        let mut wait = None;
        for (k, v) in pairs {
            if k != "wait" {
                continue;
            }
            let bad = |why: &str| {
                ApiError::bad_request(format!("invalid query string: {why}"), Some("wait".into()))
            };
            if wait.is_some() {
                return Err(bad("wait is given twice"));
            }
            wait = Some(match v.as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(bad("wait must be true or false")),
            });
        }
        Ok(WaitQuery {
            wait: wait.unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{BindingInput, BulkInput};

    fn err<T: DeserializeOwned>(body: &[u8]) -> BodyRejection {
        match parse::<T>(body) {
            Ok(_) => panic!("{} parsed", String::from_utf8_lossy(body)),
            Err(e) => e,
        }
    }

    #[test]
    fn json_errors_name_the_field_and_hide_values() {
        let e = err::<BindingInput>(br#"{"plugin":"p","provider":"q","service":"s","bogus":1}"#);
        assert_eq!(e.field.as_deref(), Some("bogus"), "{e:?}");
        assert!(matches!(e.error, BodyError::UnknownField { .. }), "{e:?}");
        let e = err::<BindingInput>(
            br#"{"plugin":"p","provider":"q","service":"s","config":"hunter2-secret"}"#,
        );
        assert_eq!(e.field.as_deref(), Some("config"), "{e:?}");
        assert!(!e.message().contains("hunter2"), "{e:?}");
        assert!(e.message().contains("expected a map"), "{e:?}");
        let e = err::<BindingInput>(
            br#"{"plugin":"p","provider":"q","service":"s","interval_secs":"soon-secret"}"#,
        );
        assert_eq!(e.field.as_deref(), Some("interval_secs"), "{e:?}");
        assert!(!e.message().contains("soon-secret"), "{e:?}");
        let e = err::<BindingInput>(
            br#"{"plugin":"p","provider":"q","service":"s","interval_secs":-1}"#,
        );
        assert!(matches!(e.error, BodyError::InvalidValue { .. }), "{e:?}");
        let e = err::<BulkInput>(br#"{"bindings":[{"plugin":"p","provider":"q","service":5}]}"#);
        assert_eq!(e.field.as_deref(), Some("bindings[0].service"), "{e:?}");
        let e = err::<BulkInput>(br#"{}"#);
        assert_eq!(e.error, BodyError::MissingField("bindings"));
        assert_eq!(e.field.as_deref(), Some("bindings"), "{e:?}");
        let e = err::<BindingInput>(b"not json");
        assert_eq!(e.field, None);
        assert!(matches!(e.error, BodyError::Syntax(_)), "{e:?}");
        assert!(e.message().starts_with("invalid JSON body"), "{e:?}");
    }

    #[test]
    fn wait_is_true_or_false_at_most_once() {
        assert!(WaitQuery::parse("wait=true").unwrap().wait);
        assert!(!WaitQuery::parse("wait=false&other=1").unwrap().wait);
        assert!(!WaitQuery::parse("").unwrap().wait);
        for bad in ["wait=maybe", "wait=", "wait=1", "wait=true&wait=false"] {
            let e = WaitQuery::parse(bad).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.body.error.field.as_deref(), Some("wait"), "{bad}");
        }
    }

    #[test]
    fn a_member_given_twice_is_refused() {
        let e =
            err::<BindingInput>(br#"{"plugin":"p","provider":"q","service":"a","service":"b"}"#);
        assert_eq!(e.error, BodyError::Duplicate("service".into()));
        assert_eq!(e.field.as_deref(), Some("service"));
        let e = err::<BulkInput>(br#"{"bindings":[{"config":{"k":1,"k":2}}]}"#);
        assert_eq!(e.field.as_deref(), Some("bindings[0].config.k"), "{e:?}");
        let e = err::<BindingInput>(br#"{"plugin":"p"} trailing"#);
        assert!(matches!(e.error, BodyError::Syntax(_)), "{e:?}");
    }

    #[test]
    fn values_of_every_json_type_pass_through() {
        let i: BindingInput = parse(
            br#"{"name":"a","plugin":"p","provider":"q","service":"s","interval_secs":30,
                 "config":{"b":true,"n":-5,"f":1.5,"s":"x","l":[1,"y"],"o":{"z":null}},
                 "directives":["keepalive 2;"]}"#,
        )
        .unwrap();
        assert_eq!(i.interval_secs, Some(30));
        assert_eq!(
            serde_json::to_value(&i.config).unwrap(),
            serde_json::json!({"b":true,"n":-5,"f":1.5,"s":"x","l":[1,"y"],"o":{"z":null}})
        );
        assert_eq!(i.directives, vec!["keepalive 2;".to_string()]);
    }
}
