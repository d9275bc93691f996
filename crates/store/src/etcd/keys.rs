//! The key layout under the prefix (`docs/fleet.md` is the reference) and the binding value.
//!
//! ```text
//! PREFIX/bindings/NAME            binding JSON, config sealed           (no lease)
//! PREFIX/hosts/HOST               heartbeat JSON                        (HOST's lease)
//! PREFIX/resolvers/NAME           HOST resolving NAME                   (HOST's lease)
//! PREFIX/targets/NAME             TargetSet JSON of the last resolution (no lease)
//! PREFIX/outcomes/NAME/HOST       HostOutcome JSON of HOST for NAME     (no lease)
//! PREFIX/unable/NAME/HOST         why HOST stepped out of resolving NAME (HOST's lease)
//! PREFIX/writes/HOST/ID[/refused] empty: the markers of one write (write.rs) (HOST's writes' lease)
//! PREFIX/names/LOWER              NAME whose lower case is LOWER (names.rs)   (no lease)
//! PREFIX/integrity                the fleet requires a MAC on every value (auth.rs) (no lease)
//! ```
//!
//! Binding values (`value.rs`, re-exported here) and target sets end with a MAC member (`auth.rs`).

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
    Outcome {
        binding: String,
        host: String,
    },
    /// `HOST` stepped out of resolving `binding` (repeated failures, `docs/fleet.md`).
    Unable {
        binding: String,
        host: String,
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
    pub fn outcome(&self, name: &str, host: &str) -> String {
        format!("{}outcomes/{name}/{host}", self.prefix)
    }
    pub fn unable(&self, name: &str, host: &str) -> String {
        format!("{}unable/{name}/{host}", self.prefix)
    }
    /// The prefix of every host's "cannot resolve" marker for `name`.
    pub fn unable_of(&self, name: &str) -> String {
        format!("{}unable/{name}/", self.prefix)
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
    /// The prefix of every host's outcome for `name`.
    pub fn outcomes_of(&self, name: &str) -> String {
        format!("{}outcomes/{name}/", self.prefix)
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
            "outcomes" => {
                let (binding, host) = name.rsplit_once('/')?;
                Kind::Outcome {
                    binding: binding.to_string(),
                    host: host.to_string(),
                }
            }
            "unable" => {
                let (binding, host) = name.rsplit_once('/')?;
                Kind::Unable {
                    binding: binding.to_string(),
                    host: host.to_string(),
                }
            }
            _ => return None,
        })
    }
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
                host: "h1".into()
            })
        );
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
