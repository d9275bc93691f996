//! The plugin manifest, `plugin.json`, with strict validation.
//!
//! This file holds the manifest itself, its checks and the environment rules; `provider` holds
//! what a provider declares (its configuration fields and their types) and the secrets a new
//! configuration may keep.

mod provider;

pub use provider::{Configuration, FieldDecl, FieldType, ProviderDecl, SecretNotResent};

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What a plugin offers. Only `upstream.discovery` exists today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// `upstream.discovery`: resolves services into servers (`discovery.resolve`).
    UpstreamDiscovery,
}

impl Capability {
    /// Every known capability.
    pub const ALL: &'static [Capability] = &[Capability::UpstreamDiscovery];

    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::UpstreamDiscovery => "upstream.discovery",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == s)
    }
}

/// What a plugin is allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// `network`: open network connections (required by `upstream.discovery`).
    Network,
    /// `filesystem`: read files outside its own folder.
    Filesystem,
}

impl Permission {
    /// Every known permission.
    pub const ALL: &'static [Permission] = &[Permission::Network, Permission::Filesystem];

    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Network => "network",
            Permission::Filesystem => "filesystem",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|p| p.as_str() == s)
    }
}

macro_rules! serde_as_str {
    ($t:ty, $what:literal) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!(concat!("unknown ", $what, " {:?}"), s))
                })
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
serde_as_str!(Capability, "capability");
serde_as_str!(Permission, "permission");

/// The `discovery` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    pub providers: Vec<ProviderDecl>,
}

/// A validated `plugin.json`. Build it with [`Manifest::parse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    /// Path of the executable, relative to the plugin's folder (an absolute path is accepted too).
    pub executable: String,
    pub capabilities: Vec<Capability>,
    #[serde(default)]
    pub permissions: Vec<Permission>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    /// Variables of the daemon's environment the plugin receives, besides the clean base the host
    /// always sets (`PATH`, `LANG`, `TZ`, `HOME`): names (`CONSUL_CACERT`) or prefixes ending in
    /// `*` (`AWS_*`). Nothing else of the daemon's environment reaches a plugin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<String>,
}

/// Variables the host sets for every plugin itself: a manifest cannot ask for them.
pub const HOST_SET_VARIABLES: &[&str] = &["PATH", "LANG", "TZ", "HOME"];
/// Prefix of the daemon's own settings (`TRIBUTARY_TOKEN`, `TRIBUTARY_UI_PASSWORD`, ...): never
/// passed to a plugin, whatever its manifest says.
pub const DAEMON_PREFIX: &str = "TRIBUTARY_";

/// Whether `name` is a variable a plugin's `environment` list lets through. The daemon's own
/// settings (`TRIBUTARY_*`) never are.
pub fn environment_allows(environment: &[String], name: &str) -> bool {
    if name.to_ascii_uppercase().starts_with(DAEMON_PREFIX) {
        return false;
    }
    environment.iter().any(|e| match e.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == e,
    })
}

/// Why a manifest was refused. The message names the problem; it never contains config values
/// (a manifest holds none).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON, or a member of the wrong type, an unknown member, an unknown capability...
    #[error("plugin.json is invalid: {0}")]
    Syntax(String),
    #[error("plugin.json: `{0}` must not be empty")]
    Empty(String),
    #[error(
        "plugin.json: name {0:?} is invalid (1-64 characters: letters, digits, `_`, `-`, `.`; not starting with `.`)"
    )]
    BadName(String),
    #[error("plugin.json: `capabilities` is empty: a plugin must declare at least one capability")]
    NoCapability,
    #[error("plugin.json: capability {0:?} is declared twice")]
    DuplicateCapability(String),
    #[error("plugin.json: permission {0:?} is requested twice")]
    DuplicatePermission(String),
    #[error(
        "plugin.json: the plugin declares the {0:?} capability but does not request the \"network\" permission; add \"network\" to `permissions`"
    )]
    MissingNetworkPermission(String),
    #[error(
        "plugin.json: the \"upstream.discovery\" capability needs a `discovery.providers` list with at least one provider"
    )]
    NoProviders,
    #[error(
        "plugin.json: a `discovery` section is given but the plugin does not declare the \"upstream.discovery\" capability"
    )]
    DiscoveryWithoutCapability,
    #[error(
        "plugin.json: provider code {0:?} is invalid (1-64 characters: letters, digits, `_`, `-`, `.`)"
    )]
    BadProviderCode(String),
    #[error("plugin.json: provider code {0:?} is declared twice")]
    DuplicateProvider(String),
    #[error(
        "plugin.json: provider {provider:?}: field key {key:?} is invalid (1-64 characters: letters, digits, `_`, `-`, `.`)"
    )]
    BadFieldKey { provider: String, key: String },
    #[error("plugin.json: provider {provider:?}: field key {key:?} is declared twice")]
    DuplicateField { provider: String, key: String },
    #[error(
        "plugin.json: provider {provider:?}: field {key:?}: `default` is not a {expected} (the field's type)"
    )]
    BadDefault {
        provider: String,
        key: String,
        expected: &'static str,
    },
    #[error(
        "plugin.json: provider {provider:?}: field {key:?} is marked both `secret` and `endpoint`; an endpoint is where secrets are sent, not a secret itself"
    )]
    SecretEndpoint { provider: String, key: String },
    #[error(
        "plugin.json: `environment` entry {0:?} is invalid (a variable name: letters, digits and `_`, not starting with a digit, at most 128 characters; or such a prefix followed by one final `*`)"
    )]
    BadEnvironment(String),
    #[error("plugin.json: `environment` entry {0:?} is listed twice")]
    DuplicateEnvironment(String),
    #[error(
        "plugin.json: `environment` entry {0:?} is set by the host for every plugin (PATH, LANG, TZ, HOME); leave it out"
    )]
    HostSetEnvironment(String),
    #[error(
        "plugin.json: `environment` entry {0:?} would pass the daemon's own settings (TRIBUTARY_*), which never reach a plugin"
    )]
    DaemonEnvironment(String),
}

/// Checks one `environment` entry (see [`Manifest::environment`]).
fn check_environment(e: &str) -> Result<(), ManifestError> {
    let (name, pattern) = match e.strip_suffix('*') {
        Some(p) => (p, true),
        None => (e, false),
    };
    let valid = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(ManifestError::BadEnvironment(e.to_string()));
    }
    let upper = name.to_ascii_uppercase();
    let daemon = upper.starts_with(DAEMON_PREFIX) || (pattern && DAEMON_PREFIX.starts_with(&upper));
    if daemon {
        return Err(ManifestError::DaemonEnvironment(e.to_string()));
    }
    if !pattern && HOST_SET_VARIABLES.contains(&name) {
        return Err(ManifestError::HostSetEnvironment(e.to_string()));
    }
    Ok(())
}

fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn non_empty(what: &str, s: &str) -> Result<(), ManifestError> {
    if s.trim().is_empty() {
        Err(ManifestError::Empty(what.to_string()))
    } else {
        Ok(())
    }
}

impl Manifest {
    /// Parses and validates a `plugin.json`. Whether the executable exists is the host's check
    /// (this crate does no IO).
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let m: Manifest =
            serde_json::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Checks every rule of a manifest (see [`ManifestError`] for the list).
    pub fn validate(&self) -> Result<(), ManifestError> {
        if !valid_ident(&self.name) {
            return Err(ManifestError::BadName(self.name.clone()));
        }
        non_empty("version", &self.version)?;
        non_empty("executable", &self.executable)?;
        if self.capabilities.is_empty() {
            return Err(ManifestError::NoCapability);
        }
        let mut seen = BTreeSet::new();
        for c in &self.capabilities {
            if !seen.insert(*c) {
                return Err(ManifestError::DuplicateCapability(c.to_string()));
            }
        }
        let mut seen = BTreeSet::new();
        for p in &self.permissions {
            if !seen.insert(*p) {
                return Err(ManifestError::DuplicatePermission(p.to_string()));
            }
        }
        let mut seen = BTreeSet::new();
        for e in &self.environment {
            check_environment(e)?;
            if !seen.insert(e.as_str()) {
                return Err(ManifestError::DuplicateEnvironment(e.clone()));
            }
        }
        let discovery = self.has_capability(Capability::UpstreamDiscovery);
        if discovery && !self.permissions.contains(&Permission::Network) {
            return Err(ManifestError::MissingNetworkPermission(
                Capability::UpstreamDiscovery.to_string(),
            ));
        }
        match (&self.discovery, discovery) {
            (None, true) => return Err(ManifestError::NoProviders),
            (Some(_), false) => return Err(ManifestError::DiscoveryWithoutCapability),
            (Some(d), true) if d.providers.is_empty() => return Err(ManifestError::NoProviders),
            _ => {}
        }
        let mut codes = BTreeSet::new();
        for p in self.providers() {
            if !valid_ident(&p.code) {
                return Err(ManifestError::BadProviderCode(p.code.clone()));
            }
            if !codes.insert(p.code.as_str()) {
                return Err(ManifestError::DuplicateProvider(p.code.clone()));
            }
            non_empty(&format!("provider {:?}: name", p.code), &p.name)?;
            let mut keys = BTreeSet::new();
            for f in &p.configuration.fields {
                if !valid_ident(&f.key) {
                    return Err(ManifestError::BadFieldKey {
                        provider: p.code.clone(),
                        key: f.key.clone(),
                    });
                }
                if !keys.insert(f.key.as_str()) {
                    return Err(ManifestError::DuplicateField {
                        provider: p.code.clone(),
                        key: f.key.clone(),
                    });
                }
                non_empty(
                    &format!("provider {:?}: field {:?}: display_name", p.code, f.key),
                    &f.display_name,
                )?;
                if f.secret && f.endpoint {
                    return Err(ManifestError::SecretEndpoint {
                        provider: p.code.clone(),
                        key: f.key.clone(),
                    });
                }
                if let Some(d) = &f.default {
                    if !d.is_null() && !f.field_type.accepts(d) {
                        return Err(ManifestError::BadDefault {
                            provider: p.code.clone(),
                            key: f.key.clone(),
                            expected: f.field_type.as_str(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the plugin declares `c`.
    pub fn has_capability(&self, c: Capability) -> bool {
        self.capabilities.contains(&c)
    }

    /// The discovery providers (empty when the plugin offers none).
    pub fn providers(&self) -> &[ProviderDecl] {
        self.discovery
            .as_ref()
            .map(|d| d.providers.as_slice())
            .unwrap_or(&[])
    }

    /// The provider with `code`.
    pub fn provider(&self, code: &str) -> Option<&ProviderDecl> {
        self.providers().iter().find(|p| p.code == code)
    }
}
