//! Pure logic of the NGINX Plus-compatible API (`upstreams_api plus;`): the upstream
//! part of NGINX Plus's REST API (`/api/N/http/upstreams/...`) over the same live state and
//! writes as the native API (`crate::live`), so the tools that speak Plus's API
//! (`nginx-plus-go-client`, `nginx-prometheus-exporter -nginx.plus`, nginx-asg-sync) work on
//! open-source nginx with this module. Nothing here touches nginx.
//!
//! - [`route`]: which resource a path names, which methods it takes, the version lists.
//! - [`body`]: the JSON of a `POST`/`PATCH` of a server, validated field by field.
//! - [`view`]: the JSON of every answer (peers with statistics, servers, nginx, connections).
//! - [`write`]: a `POST`/`PATCH`/`DELETE` turned into the whole-set change the native `PUT`
//!   applies (with the generation it was planned on, for compare-and-set).
//! - [`time`]: nginx's time syntax (`10s`, `1m30s`) and ISO 8601 instants.
//!
//! The operator's documentation is `docs/plus-api.md`.

pub mod body;
pub mod route;
pub mod time;
pub mod view;
pub mod write;

use serde::Serialize;

use crate::live::ApiError;
use crate::ConfError;

/// The API versions served (`GET <loc>/`): 4 (the first without the `path`/`method` fields in
/// errors) to 9 (the newest). `nginx-plus-go-client` 0.10 asks for one of 4..8.
pub const VERSIONS: [u32; 6] = [4, 5, 6, 7, 8, 9];

/// Where the error answers point (`href`): the reference of the API this one follows.
pub const HREF: &str = "https://nginx.org/en/docs/http/ngx_http_api_module.html";

/// Largest `POST`/`PATCH` body read (one server's fields fit in a few hundred bytes).
pub const MAX_BODY: usize = 64 * 1024;

/// How often a write plans again when another writer changed the set between its read and its
/// apply (the generation moved), before it answers 409.
pub const WRITE_ATTEMPTS: usize = 16;

/// An error answer of the Plus API: HTTP status, text and Plus's error `code`. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlusError {
    /// HTTP status.
    pub status: u16,
    /// What went wrong, for people.
    pub text: String,
    /// Plus's code (`PathNotFound`, `UpstreamNotFound`, ...), for programs.
    pub code: &'static str,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    status: u16,
    text: &'a str,
    code: &'a str,
}

#[derive(Serialize)]
struct ErrorAnswer<'a> {
    error: ErrorBody<'a>,
    request_id: &'a str,
    href: &'a str,
}

impl PlusError {
    /// An error with this status, code and text.
    pub fn new(status: u16, code: &'static str, text: impl Into<String>) -> Self {
        PlusError {
            status,
            text: text.into(),
            code,
        }
    }

    /// 404 `PathNotFound`.
    pub fn path_not_found() -> Self {
        Self::new(404, "PathNotFound", "path not found")
    }

    /// 404 `UnknownVersion`.
    pub fn unknown_version() -> Self {
        Self::new(
            404,
            "UnknownVersion",
            format!(
                "unknown version: this API serves versions {}",
                VERSIONS.map(|v| v.to_string()).join(", ")
            ),
        )
    }

    /// 405 `MethodNotSupported`.
    pub fn method_not_supported() -> Self {
        Self::new(405, "MethodNotSupported", "method not supported")
    }

    /// 405 `MethodDisabled`: a write to a read-only location.
    pub fn method_disabled() -> Self {
        Self::new(
            405,
            "MethodDisabled",
            "method disabled: this upstreams_api location is read-only (\"upstreams_api plus write=on;\" enables changes)",
        )
    }

    /// 404 `UpstreamNotFound`.
    pub fn upstream_not_found(name: &str) -> Self {
        Self::new(
            404,
            "UpstreamNotFound",
            format!("upstream \"{name}\" not found"),
        )
    }

    /// 404 `UpstreamServerNotFound`.
    pub fn server_not_found(id: u64) -> Self {
        Self::new(
            404,
            "UpstreamServerNotFound",
            format!("server with ID \"{id}\" does not exist"),
        )
    }

    /// The Plus form of an error of the native API's checks and writes (`crate::live`): an
    /// unknown upstream is `UpstreamNotFound`, one that cannot change live (no zone, another
    /// balancer, `resolve` servers) `UpstreamStatic` (400), a full zone `UpstreamOutOfMemory`
    /// (400, as Plus answers it), a busy or superseded zone 503 `UpstreamBusy`.
    pub fn from_live(e: &ApiError) -> Self {
        let (status, code) = match e.status {
            404 => (404, "UpstreamNotFound"),
            409 if is_generation_conflict(e) => (409, "UpstreamConflict"),
            409 => (400, "UpstreamStatic"),
            507 => (400, "UpstreamOutOfMemory"),
            503 => (503, "UpstreamBusy"),
            400 => (400, "UpstreamConfFormatError"),
            413 => (413, "BodyTooLarge"),
            s => (s, "InternalError"),
        };
        Self::new(status, code, e.message.clone())
    }

    /// The answer body: `{"error":{"status":…,"text":…,"code":…},"request_id":…,"href":…}`.
    pub fn to_json(&self, request_id: &str) -> String {
        let a = ErrorAnswer {
            error: ErrorBody {
                status: self.status,
                text: &self.text,
                code: self.code,
            },
            request_id,
            href: HREF,
        };
        serde_json::to_string(&a).unwrap_or_else(|_| "{}".to_string())
    }
}

/// Whether `e` is the native `PUT`'s compare-and-set refusal
/// ([`ApiError::generation_conflict`]): the set changed since the write read it.
pub fn is_generation_conflict(e: &ApiError) -> bool {
    let probe = ApiError::generation_conflict(1, 2).message;
    let tail = probe.split_once(", not 1").map_or("", |(_, t)| t);
    e.status == 409 && e.message.starts_with("generation is ") && e.message.ends_with(tail)
}

/// The words of `upstreams_api` after `plus`: whether the location speaks the Plus API, and the
/// words left for [`crate::live::Access::parse`].
pub fn split_mode<'a, 'b>(params: &'b [&'a str]) -> (bool, &'b [&'a str]) {
    match params.split_first() {
        Some((&"plus", rest)) => (true, rest),
        _ => (false, params),
    }
}

/// Refuses `plus` anywhere but first (a misplaced mode word).
pub fn check_mode_word(params: &[&str]) -> Result<(), ConfError> {
    if params.iter().skip(1).any(|p| *p == "plus") {
        return Err(ConfError::ApiParameter {
            param: "plus".into(),
            why: "plus must be the first parameter (upstreams_api plus [write=on] ...)",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_plus_shape() {
        let e = PlusError::path_not_found();
        let v: serde_json::Value = serde_json::from_str(&e.to_json("abc")).unwrap();
        assert_eq!(v["error"]["status"], 404);
        assert_eq!(v["error"]["code"], "PathNotFound");
        assert!(v["error"]["text"].is_string());
        assert_eq!(v["request_id"], "abc");
        assert_eq!(v["href"], HREF);
        assert_eq!(v.as_object().unwrap().len(), 3);
        assert!(PlusError::unknown_version()
            .text
            .contains("4, 5, 6, 7, 8, 9"));
    }

    #[test]
    fn native_errors_map_to_plus_codes() {
        let c = |e: ApiError| {
            let p = PlusError::from_live(&e);
            (p.status, p.code)
        };
        assert_eq!(
            c(ApiError::unknown_upstream("a")),
            (404, "UpstreamNotFound")
        );
        assert_eq!(c(ApiError::no_zone("a")), (400, "UpstreamStatic"));
        assert_eq!(
            c(ApiError::balancer_refused("a", "hash")),
            (400, "UpstreamStatic")
        );
        assert_eq!(c(ApiError::resolves_names("a")), (400, "UpstreamStatic"));
        assert_eq!(c(ApiError::busy("a", 1)), (503, "UpstreamBusy"));
        assert_eq!(c(ApiError::superseded("a")), (503, "UpstreamBusy"));
        assert_eq!(
            c(ApiError::generation_conflict(3, 4)),
            (409, "UpstreamConflict")
        );
    }

    #[test]
    fn a_generation_conflict_is_recognised_and_nothing_else() {
        assert!(is_generation_conflict(&ApiError::generation_conflict(
            17, 99
        )));
        assert!(!is_generation_conflict(&ApiError::no_zone("a")));
        assert!(!is_generation_conflict(&ApiError::new(
            409,
            "generation is"
        )));
    }

    #[test]
    fn the_mode_word_comes_first() {
        assert_eq!(split_mode(&["plus", "write=on"]), (true, &["write=on"][..]));
        assert_eq!(split_mode(&["write=on"]), (false, &["write=on"][..]));
        assert_eq!(split_mode(&[]), (false, &[][..]));
        assert!(check_mode_word(&["plus", "write=on"]).is_ok());
        let e = check_mode_word(&["write=on", "plus"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be the first"), "{e}");
    }
}
