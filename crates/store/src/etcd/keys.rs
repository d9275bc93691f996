//! The key layout under the prefix (`docs/fleet.md` is the reference) and the binding value.
//!
//! ```text
//! PREFIX/bindings/NAME            binding JSON, config sealed           (no lease)
//! PREFIX/hosts/HOST               heartbeat JSON                        (HOST's lease)
//! PREFIX/resolvers/NAME           HOST resolving NAME                   (HOST's lease)
//! PREFIX/targets/NAME             TargetSet JSON of the last resolution (no lease)
//! PREFIX/outcomes-by-host/HOST/NAME  HostOutcome JSON of HOST for NAME  (no lease)
//! PREFIX/unable-by-host/HOST/NAME    why HOST stepped out of resolving NAME (HOST's lease)
//! PREFIX/writes/HOST/ID[/refused] empty: the markers of one write (write.rs) (HOST's writes' lease)
//! PREFIX/names/LOWER              NAME whose lower case is LOWER (names.rs)   (no lease)
//! PREFIX/outcomes-gone/HOST       when a collector first saw HOST gone (gc.rs) (no lease)
//! PREFIX/integrity                the fleet requires a MAC on every value (auth.rs) (no lease)
//! ```
//!
//! Binding values (`value.rs`, re-exported here) and target sets end with a MAC member (`auth.rs`).
//!
//! Outcomes and `unable` markers are keyed host first, so that one etcd prefix grant
//! (`PREFIX/outcomes-by-host/HOST/`, `PREFIX/unable-by-host/HOST/`: with the trailing `/`, or
//! `host-b` would match `host-b2`) holds exactly one host's keys. The two kinds' names sort on
//! purpose (`sync.rs`): `outcomes-by-host/` falls between `names/` and `resolvers/` (not watched),
//! `unable-by-host/` between `resolvers/` and `writes/` (watched: resolvers need the markers).
//! Daemons of before wrote `PREFIX/outcomes/NAME/HOST` and `PREFIX/unable/NAME/HOST` (binding
//! first, the *old layout*): still parsed and read (the new layout wins for the same binding
//! and host), each host deletes its own once (`own_keys.rs`), the garbage collection the rest.

use serde::{Deserialize, Serialize};

use crate::StoreError;

/// The keys of one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    /// Ends with `/`.
    pub prefix: String,
}

/// What a key under the prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Binding(String),
    Host(String),
    Resolver(String),
    Targets(String),
    /// `old`: a key of the old layout (`PREFIX/outcomes/NAME/HOST`).
    Outcome {
        binding: String,
        host: String,
        old: bool,
    },
    /// `HOST` stepped out of resolving `binding` (repeated failures, `docs/fleet.md`). `old`: a
    /// key of the old layout (`PREFIX/unable/NAME/HOST`).
    Unable {
        binding: String,
        host: String,
        old: bool,
    },
    /// `PREFIX/integrity`: the fleet requires a MAC on every value (`auth.rs`).
    Integrity,
}

impl Keys {
    pub fn new(prefix: &str) -> Result<Keys, StoreError> {
        if prefix.is_empty() || prefix.contains('\0') {
            return Err(StoreError::Settings(
                "the etcd prefix must not be empty (e.g. /tributary/)".into(),
            ));
        }
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Keys { prefix })
    }

    pub fn binding(&self, name: &str) -> String {
        format!("{}bindings/{name}", self.prefix)
    }
    pub fn host(&self, host: &str) -> String {
        format!("{}hosts/{host}", self.prefix)
    }
    pub fn resolver(&self, name: &str) -> String {
        format!("{}resolvers/{name}", self.prefix)
    }
    pub fn targets(&self, name: &str) -> String {
        format!("{}targets/{name}", self.prefix)
    }
    /// HOST's outcome of `name`.
    pub fn outcome(&self, name: &str, host: &str) -> String {
        format!("{}{OUTCOMES}{host}/{name}", self.prefix)
    }
    /// HOST's "cannot resolve `name`" marker.
    pub fn unable(&self, name: &str, host: &str) -> String {
        format!("{}{UNABLE}{host}/{name}", self.prefix)
    }
    /// The prefix of every outcome of `host` (the grant of its etcd user: ends with `/`).
    pub fn outcomes_of_host(&self, host: &str) -> String {
        format!("{}{OUTCOMES}{host}/", self.prefix)
    }
    /// The prefix of every "cannot resolve" marker of `host` (ends with `/`).
    pub fn unable_of_host(&self, host: &str) -> String {
        format!("{}{UNABLE}{host}/", self.prefix)
    }
    /// When the garbage collection first saw `host` gone (`gc.rs`; not watched: it sorts between
    /// `names/` and `resolvers/`).
    pub fn gone_since(&self, host: &str) -> String {
        format!("{}outcomes-gone/{host}", self.prefix)
    }
    /// The prefix of every [`Self::gone_since`] key.
    pub fn all_gone_since(&self) -> String {
        format!("{}outcomes-gone/", self.prefix)
    }
    /// The prefix of every host's outcomes (new layout).
    pub fn all_outcomes(&self) -> String {
        format!("{}{OUTCOMES}", self.prefix)
    }
    /// HOST's outcome of `name` in the old layout (daemons of before).
    pub fn old_outcome(&self, name: &str, host: &str) -> String {
        format!("{}outcomes/{name}/{host}", self.prefix)
    }
    /// HOST's "cannot resolve" marker in the old layout (daemons of before).
    pub fn old_unable(&self, name: &str, host: &str) -> String {
        format!("{}unable/{name}/{host}", self.prefix)
    }
    /// The prefix of every host's old-layout outcome for `name`.
    pub fn old_outcomes_of(&self, name: &str) -> String {
        format!("{}outcomes/{name}/", self.prefix)
    }
    /// The prefix of every host's old-layout "cannot resolve" marker for `name`.
    pub fn old_unable_of(&self, name: &str) -> String {
        format!("{}unable/{name}/", self.prefix)
    }
    /// The prefixes of the old layout's outcomes and markers of every binding.
    pub fn old_layout(&self) -> [String; 2] {
        [
            format!("{}outcomes/", self.prefix),
            format!("{}unable/", self.prefix),
        ]
    }
    /// The marker of write `id` of `host` (`write.rs`); not a kind the mirror applies.
    pub fn write_marker(&self, host: &str, id: &str) -> String {
        format!("{}writes/{host}/{id}", self.prefix)
    }
    /// The claim of a binding name regardless of ASCII case (`names.rs`); holds the name as
    /// written. Not a kind the mirror applies.
    pub fn name_claim(&self, name: &str) -> String {
        format!("{}names/{}", self.prefix, name.to_ascii_lowercase())
    }
    /// The fleet's "integrity required" key (`auth.rs`).
    pub fn integrity(&self) -> String {
        format!("{}integrity", self.prefix)
    }

    /// What `key` is; `None` for a key this build does not know (ignored).
    pub fn parse(&self, key: &[u8]) -> Option<Kind> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.prefix)?;
        if rest == "integrity" {
            return Some(Kind::Integrity);
        }
        let (kind, name) = rest.split_once('/')?;
        if name.is_empty() {
            return None;
        }
        Some(match kind {
            "bindings" => Kind::Binding(name.to_string()),
            "hosts" => Kind::Host(name.to_string()),
            "resolvers" => Kind::Resolver(name.to_string()),
            "targets" => Kind::Targets(name.to_string()),
            "outcomes" | "unable" => {
                let (binding, host) = name.rsplit_once('/')?;
                host_and_binding(kind, host, binding, true)?
            }
            "outcomes-by-host" | "unable-by-host" => {
                let (host, binding) = name.split_once('/')?;
                host_and_binding(kind, host, binding, false)?
            }
            _ => return None,
        })
    }
}

/// The new layout's kinds (`docs/fleet.md`, "Key layout"), with their `/`.
const OUTCOMES: &str = "outcomes-by-host/";
const UNABLE: &str = "unable-by-host/";

/// An outcome or `unable` key's kind, of either layout (`None`: an empty part).
fn host_and_binding(kind: &str, host: &str, binding: &str, old: bool) -> Option<Kind> {
    if host.is_empty() || binding.is_empty() {
        return None;
    }
    let (binding, host) = (binding.to_string(), host.to_string());
    Some(if kind.starts_with("outcomes") {
        Kind::Outcome { binding, host, old }
    } else {
        Kind::Unable { binding, host, old }
    })
}

/// A host id: non-empty, at most 253 bytes, no `/`, no control characters.
pub fn check_host_id(id: &str) -> Result<(), StoreError> {
    if id.is_empty() || id.len() > 253 || id.contains('/') || id.chars().any(char::is_control) {
        return Err(StoreError::Settings(format!(
            "host id {id:?}: it must be 1-253 characters without '/' or control characters"
        )));
    }
    Ok(())
}

/// The heartbeat of a host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostBeat {
    pub started_ms: i64,
    /// What the host can resolve; absent (a daemon of before) means anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can: Option<Can>,
}

/// What a host can resolve: the `plugin/provider` pairs of its plugins dir and the ids of the
/// secrets keys it can open (key ids are public: every sealed value names its own). The other
/// hosts leave a host out of the rendezvous choice of a binding it cannot resolve.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Can {
    /// `None`: any (the host did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub providers: Option<Vec<String>>,
    pub keys: Vec<String>,
    /// The host verifies and writes MACs (`auth.rs`); absent (a daemon of before): it does not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auth: bool,
}

impl Can {
    /// Whether a host with these capabilities can resolve a binding of `need`.
    pub fn covers(&self, need: &Need) -> bool {
        self.providers
            .as_ref()
            .is_none_or(|ps| ps.contains(&need.provider))
            && self.keys.contains(&need.key_id)
    }
}

/// What resolving one binding takes, read from its newest stored value without opening it
/// (`plugin/provider` and the id of the key that sealed its config are plain text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub provider: String,
    pub key_id: String,
}

/// `plugin/provider`, the form of [`Can::providers`] and [`Need::provider`].
pub fn provider_pair(plugin: &str, provider: &str) -> String {
    format!("{plugin}/{provider}")
}

pub use super::value::{decode_binding, encode_binding, need_of, Decoded, Undecodable, Write};

#[cfg(test)]
mod tests {
    use super::*;

    /// The new kinds' names sort where they must: outcomes outside the watched ranges, `unable`
    /// markers inside (a resolver needs them), of both layouts.
    #[test]
    fn outcomes_are_not_watched_and_step_out_markers_are() {
        let k = Keys::new("/t").unwrap();
        let ranges = super::super::sync::watched_ranges(&k);
        let watched = |key: String| {
            ranges
                .iter()
                .any(|(s, e)| key.as_bytes() >= s.as_slice() && key.as_bytes() < e.as_slice())
        };
        assert!(!watched(k.outcome("api", "h1")));
        assert!(!watched(k.old_outcome("api", "h1")));
        assert!(watched(k.unable("api", "h1")));
        assert!(watched(k.old_unable("api", "h1")));
        for key in [
            k.binding("api"),
            k.host("h1"),
            k.resolver("api"),
            k.targets("api"),
        ] {
            assert!(watched(key));
        }
        assert!(!watched(k.write_marker("h1", "x")));
        assert!(!watched(k.name_claim("api")));
        assert!(!watched(k.gone_since("h1")));
        assert!(!k.gone_since("h1").starts_with(&k.old_layout()[0]));
        assert_eq!(k.parse(k.gone_since("h1").as_bytes()), None);
        // Neither layout's prefix holds the other's keys.
        for [old, new] in [
            [k.old_outcomes_of("api"), k.outcome("api", "h1")],
            [k.old_unable_of("api"), k.unable("api", "h1")],
        ] {
            assert!(!new.starts_with(&old));
        }
        for p in k.old_layout() {
            assert!(!k.outcome("api", "h1").starts_with(&p));
            assert!(!k.unable("api", "h1").starts_with(&p));
        }
    }

    #[test]
    fn keys_round_trip_through_parse() {
        let k = Keys::new("/t").unwrap();
        assert_eq!(k.prefix, "/t/");
        assert_eq!(
            k.parse(k.binding("api").as_bytes()),
            Some(Kind::Binding("api".into()))
        );
        assert_eq!(
            k.parse(k.outcome("api", "h1").as_bytes()),
            Some(Kind::Outcome {
                binding: "api".into(),
                host: "h1".into(),
                old: false
            })
        );
        assert_eq!(k.outcome("api", "h1"), "/t/outcomes-by-host/h1/api");
        assert_eq!(
            k.parse(k.old_outcome("api", "h1").as_bytes()),
            Some(Kind::Outcome {
                binding: "api".into(),
                host: "h1".into(),
                old: true
            })
        );
        assert_eq!(
            k.parse(k.unable("api", "h1").as_bytes()),
            Some(Kind::Unable {
                binding: "api".into(),
                host: "h1".into(),
                old: false
            })
        );
        assert_eq!(
            k.parse(k.old_unable("api", "h1").as_bytes()),
            Some(Kind::Unable {
                binding: "api".into(),
                host: "h1".into(),
                old: true
            })
        );
        assert_eq!(k.parse(b"/t/outcomes-by-host/h1/"), None);
        assert_eq!(k.parse(b"/t/unable-by-host//api"), None);
        // A host's grant ends with `/`: host-b's prefix does not hold host-b2's keys.
        assert!(!k
            .outcome("api", "host-b2")
            .starts_with(&k.outcomes_of_host("host-b")));
        assert!(k
            .outcome("api", "host-b")
            .starts_with(&k.outcomes_of_host("host-b")));
        assert_eq!(
            k.parse(k.host("h1").as_bytes()),
            Some(Kind::Host("h1".into()))
        );
        assert_eq!(k.parse(b"/t/unknown/x"), None);
        assert_eq!(k.parse(b"/other/bindings/x"), None);
        assert!(check_host_id("a/b").is_err());
        assert!(check_host_id("").is_err());
        assert!(check_host_id("web-1.example").is_ok());
    }
}
