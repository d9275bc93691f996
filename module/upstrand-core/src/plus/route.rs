//! Which resource a path below the Plus API location names (`<loc>/`, `<loc>/8/nginx`,
//! `<loc>/8/http/upstreams/NAME/servers/3/`, a trailing slash or none), and which methods it
//! takes. Paths of what this API does not serve at all (`stream/...`, `workers`, `license`) are
//! `PathNotFound`, as Plus answers for a `stream` it does not have, which the clients accept.

use super::{PlusError, VERSIONS};

/// A request method as the API tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET` (and `HEAD`).
    Get,
    /// `POST`
    Post,
    /// `PATCH`
    Patch,
    /// `DELETE`
    Delete,
    /// Anything else.
    Other,
}

/// A collection whose entries the API lists (`{}`: none) and whose named entries it never finds:
/// what open-source nginx does not keep (see `docs/plus-api.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Empty {
    /// `/http/server_zones` (`status_zone` is Plus's).
    ServerZones,
    /// `/http/location_zones` (version 5+).
    LocationZones,
    /// `/http/caches` (nginx keeps no hit/miss counters).
    Caches,
    /// `/http/limit_reqs` (version 6+).
    LimitReqs,
    /// `/http/limit_conns` (version 6+).
    LimitConns,
    /// `/http/keyvals` (the keyval module is Plus's).
    Keyvals,
    /// `/resolvers` (version 5+; `resolver ... status_zone=` is Plus's).
    Resolvers,
}

impl Empty {
    /// Plus's code for a named entry that does not exist.
    pub fn not_found_code(self) -> &'static str {
        match self {
            Empty::ServerZones => "ServerZoneNotFound",
            Empty::LocationZones => "LocationZoneNotFound",
            Empty::Caches => "CacheNotFound",
            Empty::LimitReqs => "LimitReqNotFound",
            Empty::LimitConns => "LimitConnNotFound",
            Empty::Keyvals => "KeyvalZoneNotFound",
            Empty::Resolvers => "ResolverZoneNotFound",
        }
    }
}

/// A resource of one API version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// `<loc>` or `<loc>/`: the versions (`[4,5,...]`).
    Versions,
    /// `<loc>/N/`: the first-level endpoints.
    Root,
    /// `<loc>/N/http/`: the HTTP endpoints.
    Http,
    /// `/nginx`
    Nginx,
    /// `/processes`
    Processes,
    /// `/connections`
    Connections,
    /// `/ssl`
    Ssl,
    /// `/slabs`
    Slabs,
    /// `/slabs/ZONE`
    Slab(String),
    /// `/http/requests`
    HttpRequests,
    /// A collection this API keeps empty.
    Empty(Empty),
    /// A named entry of such a collection (never found).
    EmptyEntry(Empty, String),
    /// `/http/upstreams`
    Upstreams,
    /// `/http/upstreams/NAME`
    Upstream(String),
    /// `/http/upstreams/NAME/servers`
    Servers(String),
    /// `/http/upstreams/NAME/servers/ID`
    Server(String, u64),
}

/// A routed request: the API version and the resource (version 0 for [`Resource::Versions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The version in the path.
    pub version: u32,
    /// What it names.
    pub resource: Resource,
}

/// What to do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Answer the resource (`GET`/`HEAD`).
    Read,
    /// Add a server (`POST .../servers`).
    Add,
    /// Change a server (`PATCH .../servers/ID`).
    Patch,
    /// Remove a server (`DELETE .../servers/ID`).
    Delete,
}

/// Maps the part of the URI after the location prefix to a resource.
pub fn route(rest: &[u8]) -> Result<Route, PlusError> {
    let rest = std::str::from_utf8(rest).map_err(|_| PlusError::path_not_found())?;
    let rest = match rest.strip_prefix('/') {
        Some(r) => r,
        None if rest.is_empty() => rest,
        // `location /api` also matches `/apiary`.
        None => return Err(PlusError::path_not_found()),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok(Route {
            version: 0,
            resource: Resource::Versions,
        });
    }
    let mut parts = rest.split('/');
    let version_text = parts.next().unwrap_or_default();
    let version: u32 = version_text
        .parse()
        .ok()
        .filter(|_| version_text.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(PlusError::unknown_version)?;
    if !VERSIONS.contains(&version) {
        return Err(PlusError::unknown_version());
    }
    let parts: Vec<&str> = parts.collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(PlusError::path_not_found());
    }
    let name = |s: &str| s.to_string();
    let from = |v: u32| version >= v;
    let resource = match parts.as_slice() {
        [] => Resource::Root,
        ["nginx"] => Resource::Nginx,
        ["processes"] => Resource::Processes,
        ["connections"] => Resource::Connections,
        ["ssl"] => Resource::Ssl,
        ["slabs"] => Resource::Slabs,
        ["slabs", z] => Resource::Slab(name(z)),
        ["resolvers"] if from(5) => Resource::Empty(Empty::Resolvers),
        ["resolvers", z] if from(5) => Resource::EmptyEntry(Empty::Resolvers, name(z)),
        ["http"] => Resource::Http,
        ["http", "requests"] => Resource::HttpRequests,
        ["http", "upstreams"] => Resource::Upstreams,
        ["http", "upstreams", u] => Resource::Upstream(name(u)),
        ["http", "upstreams", u, "servers"] => Resource::Servers(name(u)),
        ["http", "upstreams", u, "servers", id] => Resource::Server(name(u), server_id(id)?),
        ["http", coll] | ["http", coll, _] => {
            let kind = match *coll {
                "server_zones" => Empty::ServerZones,
                "location_zones" if from(5) => Empty::LocationZones,
                "caches" => Empty::Caches,
                "limit_reqs" if from(6) => Empty::LimitReqs,
                "limit_conns" if from(6) => Empty::LimitConns,
                "keyvals" => Empty::Keyvals,
                _ => return Err(PlusError::path_not_found()),
            };
            match parts.get(2) {
                Some(z) => Resource::EmptyEntry(kind, name(z)),
                None => Resource::Empty(kind),
            }
        }
        _ => return Err(PlusError::path_not_found()),
    };
    Ok(Route { version, resource })
}

/// A server id in a path: a decimal number (Plus: `UpstreamBadServerId`, 400).
fn server_id(text: &str) -> Result<u64, PlusError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PlusError::new(
            400,
            "UpstreamBadServerId",
            format!("invalid server ID \"{text}\""),
        ));
    }
    text.parse().map_err(|_| {
        PlusError::new(
            400,
            "UpstreamBadServerId",
            format!("invalid server ID \"{text}\""),
        )
    })
}

/// What `method` on `resource` does, on a location that takes writes (`write`) or not. The
/// statistics resets Plus offers (`DELETE` of `/connections`, an upstream, ...) are not served:
/// 405 `MethodDisabled` on a read-only location (as Plus), `MethodNotSupported` on one with
/// writes.
pub fn action(method: Method, resource: &Resource, write: bool) -> Result<Action, PlusError> {
    let resettable = matches!(
        resource,
        Resource::Processes
            | Resource::Connections
            | Resource::Ssl
            | Resource::Slab(_)
            | Resource::HttpRequests
            | Resource::EmptyEntry(..)
            | Resource::Upstream(_)
    );
    let wanted = match (method, resource) {
        (Method::Get, _) => return Ok(Action::Read),
        (Method::Post, Resource::Servers(_)) => Action::Add,
        (Method::Patch, Resource::Server(..)) => Action::Patch,
        (Method::Delete, Resource::Server(..)) => Action::Delete,
        (Method::Delete, _) if resettable && !write => return Err(PlusError::method_disabled()),
        _ => return Err(PlusError::method_not_supported()),
    };
    if !write {
        return Err(PlusError::method_disabled());
    }
    Ok(wanted)
}

/// `GET <loc>/N/`: the first-level endpoints of version `v`.
pub fn root_endpoints(v: u32) -> Vec<&'static str> {
    let mut e = vec!["nginx", "processes", "connections", "slabs", "http"];
    if v >= 5 {
        e.push("resolvers");
    }
    e.push("ssl");
    e
}

/// `GET <loc>/N/http/`: the HTTP endpoints of version `v`.
pub fn http_endpoints(v: u32) -> Vec<&'static str> {
    let mut e = vec!["requests", "server_zones"];
    if v >= 5 {
        e.push("location_zones");
    }
    e.push("caches");
    if v >= 6 {
        e.extend(["limit_conns", "limit_reqs"]);
    }
    e.extend(["keyvals", "upstreams"]);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(p: &str) -> Result<Resource, PlusError> {
        route(p.as_bytes()).map(|r| r.resource)
    }

    #[test]
    fn paths_name_resources_with_or_without_a_trailing_slash() {
        assert_eq!(r("").unwrap(), Resource::Versions);
        assert_eq!(r("/").unwrap(), Resource::Versions);
        assert_eq!(r("/8").unwrap(), Resource::Root);
        assert_eq!(r("/8/").unwrap(), Resource::Root);
        assert_eq!(r("/8/nginx").unwrap(), Resource::Nginx);
        assert_eq!(r("/4/http/").unwrap(), Resource::Http);
        assert_eq!(r("/9/http/upstreams").unwrap(), Resource::Upstreams);
        assert_eq!(r("/9/http/upstreams/").unwrap(), Resource::Upstreams);
        assert_eq!(
            r("/8/http/upstreams/b").unwrap(),
            Resource::Upstream("b".into())
        );
        assert_eq!(
            r("/8/http/upstreams/b/servers/").unwrap(),
            Resource::Servers("b".into())
        );
        assert_eq!(
            r("/8/http/upstreams/b/servers/12/").unwrap(),
            Resource::Server("b".into(), 12)
        );
        assert_eq!(r("/8/slabs/z").unwrap(), Resource::Slab("z".into()));
        assert_eq!(r("/8/http/caches").unwrap(), Resource::Empty(Empty::Caches));
        assert_eq!(
            r("/8/http/keyvals/one").unwrap(),
            Resource::EmptyEntry(Empty::Keyvals, "one".into())
        );
        assert_eq!(route(b"/7/connections").unwrap().version, 7);
    }

    #[test]
    fn unknown_paths_and_versions_have_plus_codes() {
        let code = |p: &str| r(p).unwrap_err().code;
        for p in [
            "/8/stream/upstreams",
            "/8/stream/server_zones",
            "/8/stream/zone_sync",
            "/8/stream/limit_conns",
            "/8/workers",
            "/9/license",
            "/8/http/nothing",
            "/8/http/upstreams/b/other",
            "/8//nginx",
            "ary",
            "/4/http/location_zones",
            "/4/resolvers",
            "/5/http/limit_reqs",
            "/5/http/limit_conns",
        ] {
            assert_eq!(code(p), "PathNotFound", "{p}");
            assert_eq!(r(p).unwrap_err().status, 404, "{p}");
        }
        for p in ["/3/nginx", "/10/nginx", "/x/nginx", "/+8/nginx", "/08x"] {
            assert_eq!(code(p), "UnknownVersion", "{p}");
        }
        assert_eq!(code("/8/http/upstreams/b/servers/x"), "UpstreamBadServerId");
        assert_eq!(
            code("/8/http/upstreams/b/servers/-1"),
            "UpstreamBadServerId"
        );
        assert!(r("/5/http/location_zones").is_ok());
        assert!(r("/6/http/limit_conns").is_ok());
    }

    #[test]
    fn methods_and_write_access() {
        let servers = Resource::Servers("b".into());
        let server = Resource::Server("b".into(), 1);
        assert_eq!(action(Method::Get, &servers, false), Ok(Action::Read));
        assert_eq!(action(Method::Post, &servers, true), Ok(Action::Add));
        assert_eq!(action(Method::Patch, &server, true), Ok(Action::Patch));
        assert_eq!(action(Method::Delete, &server, true), Ok(Action::Delete));
        for (m, res) in [
            (Method::Post, &servers),
            (Method::Patch, &server),
            (Method::Delete, &server),
            (Method::Delete, &Resource::Connections),
        ] {
            let e = action(m, res, false).unwrap_err();
            assert_eq!((e.status, e.code), (405, "MethodDisabled"), "{m:?} {res:?}");
        }
        for (m, res, w) in [
            (Method::Post, &server, true),
            (Method::Patch, &servers, true),
            (Method::Delete, &servers, true),
            (Method::Other, &servers, true),
            (Method::Post, &Resource::Nginx, false),
            (Method::Delete, &Resource::Connections, true),
        ] {
            let e = action(m, res, w).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (405, "MethodNotSupported"),
                "{m:?} {res:?}"
            );
        }
    }

    #[test]
    fn endpoint_lists_follow_the_version() {
        assert!(!root_endpoints(4).contains(&"resolvers"));
        assert!(root_endpoints(5).contains(&"resolvers"));
        assert!(!root_endpoints(9).contains(&"stream"));
        assert!(!http_endpoints(5).contains(&"limit_reqs"));
        assert!(http_endpoints(6).contains(&"limit_conns"));
        assert!(http_endpoints(4).contains(&"upstreams"));
        // Every listed endpoint routes.
        for v in VERSIONS {
            for e in root_endpoints(v) {
                assert!(route(format!("/{v}/{e}").as_bytes()).is_ok(), "{v} {e}");
            }
            for e in http_endpoints(v) {
                assert!(
                    route(format!("/{v}/http/{e}").as_bytes()).is_ok(),
                    "{v} {e}"
                );
            }
        }
    }
}
