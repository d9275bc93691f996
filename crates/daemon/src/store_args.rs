//! `tributary serve`'s store options (`--store sqlite|etcd` and the etcd settings) and the opening
//! of the chosen store (reference: `docs/cli.md`, `docs/fleet.md`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use tributary_store::{
    BindingStore, EtcdOptions, EtcdStore, EtcdTls, SecretKeys, SqliteStore, StoreOptions,
};

/// Which store holds the bindings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// One host: a SQLite file in the data folder.
    Sqlite,
    /// A fleet of hosts sharing their bindings through etcd (docs/fleet.md).
    Etcd,
}

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Where bindings live: `sqlite` (this host only) or `etcd` (shared by a fleet of hosts).
    #[arg(long = "store", value_enum, default_value_t = StoreKind::Sqlite)]
    pub kind: StoreKind,
    /// This host's id in the fleet (unique, no '/'). Default: the host name.
    #[arg(long)]
    pub host_id: Option<String>,
    /// etcd client URLs, comma-separated (`http://10.0.0.1:2379,...`; `https://` with --etcd-ca).
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL...]")]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of this fleet in etcd.
    #[arg(long, default_value = "/tributary/")]
    pub etcd_prefix: String,
    /// File of 32 random bytes (mode 0600) that seals binding configs in etcd; the same on every
    /// host. Repeatable or comma-separated: the first seals, all open (key rotation).
    #[arg(long, value_delimiter = ',', value_name = "FILE")]
    pub secrets_key: Vec<PathBuf>,
    /// A secrets key file that is retired (repeatable): it still opens and verifies, never seals,
    /// and this host re-seals the bindings it sealed with the active key (a few a second).
    /// Nothing else re-seals (docs/fleet.md, "Rotation").
    #[arg(long, value_delimiter = ',', value_name = "FILE")]
    pub retired_secrets_key: Vec<PathBuf>,
    /// Refuse every binding value and target set without a MAC, and make the whole fleet do so
    /// (puts the fleet's integrity key): the explicit step once every host runs a version that
    /// writes MACs (docs/fleet.md, "Integrity"). A new fleet requires it from the start.
    #[arg(long)]
    pub etcd_require_integrity: bool,
    /// CA certificate (PEM) of the etcd members' certificates.
    #[arg(long)]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's mutual TLS (with --etcd-key).
    #[arg(long)]
    pub etcd_cert: Option<PathBuf>,
    /// Client key (PEM) for etcd's mutual TLS (with --etcd-cert).
    #[arg(long)]
    pub etcd_key: Option<PathBuf>,
    /// etcd user (with --etcd-password-file).
    #[arg(long)]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (first line; never on the command line).
    #[arg(long)]
    pub etcd_password_file: Option<PathBuf>,
    /// Lease TTL of this host's heartbeat and resolver claims, in seconds: a dead host's bindings
    /// are resolved by another host within it.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=300))]
    pub etcd_lease_ttl_secs: u64,
    /// How long one etcd operation may take, in milliseconds (a save fails after it).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=60000))]
    pub etcd_timeout_ms: u64,
    /// The outcomes of a host whose heartbeat has been gone this many seconds are removed from
    /// etcd (so from every host's fleet view); default one day.
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub etcd_forget_gone_hosts_secs: u64,
}

/// This host's id in a fleet (`--host-id`'s default): the kernel's host name, else `localhost`.
pub fn default_host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The first line of a password file (which must not be readable by group or others).
fn read_password(file: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file)
        .with_context(|| format!("--etcd-password-file {}", file.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "--etcd-password-file {} has mode {mode:04o}: it must be readable by its owner only (chmod 600)",
            file.display()
        );
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--etcd-password-file {}", file.display()))?;
    let pw = text.lines().next().unwrap_or("").to_string();
    if pw.is_empty() {
        bail!("--etcd-password-file {} is empty", file.display());
    }
    Ok(pw)
}

impl StoreArgs {
    /// Opens the chosen store. etcd: checks every setting now (a wrong one stops the daemon with a
    /// message), then waits for the first sync of the mirror at most twice the operation timeout;
    /// when etcd does not answer by then the daemon starts from its local mirror and the store
    /// keeps connecting in the background.
    pub async fn open(
        &self,
        data_dir: &Path,
        history: usize,
        providers: Vec<String>,
    ) -> anyhow::Result<Arc<dyn BindingStore>> {
        let host_id = self.host_id.clone().unwrap_or_else(default_host_id);
        let history = StoreOptions {
            history_per_binding: history.max(1),
        };
        match self.kind {
            StoreKind::Sqlite => {
                let etcd_only = !self.etcd_endpoints.is_empty()
                    || !self.secrets_key.is_empty()
                    || self.etcd_user.is_some();
                if etcd_only {
                    tracing::warn!("etcd settings given without --store etcd: they are not used");
                }
                Ok(Arc::new(SqliteStore::open(
                    &data_dir.join("tributary.db"),
                    history,
                    &host_id,
                )?))
            }
            StoreKind::Etcd => {
                if self.etcd_endpoints.is_empty() {
                    bail!("--store etcd needs --etcd-endpoints URL[,URL...]");
                }
                if self.secrets_key.is_empty() {
                    bail!("--store etcd needs --secrets-key FILE (32 random bytes, mode 0600, the same on every host; see docs/fleet.md)");
                }
                let secrets =
                    SecretKeys::load_with_retired(&self.secrets_key, &self.retired_secrets_key)?;
                let mut opts = EtcdOptions::new(
                    self.etcd_endpoints.clone(),
                    &self.etcd_prefix,
                    &host_id,
                    &data_dir.join("tributary-etcd.db"),
                );
                opts.history = history;
                opts.require_integrity = self.etcd_require_integrity;
                opts.providers = Some(providers);
                opts.lease_ttl = Duration::from_secs(self.etcd_lease_ttl_secs);
                opts.op_timeout = Duration::from_millis(self.etcd_timeout_ms);
                opts.forget_gone_hosts_after =
                    Duration::from_secs(self.etcd_forget_gone_hosts_secs);
                if self.etcd_ca.is_some() || self.etcd_cert.is_some() || self.etcd_key.is_some() {
                    if self.etcd_cert.is_some() != self.etcd_key.is_some() {
                        bail!("--etcd-cert and --etcd-key go together");
                    }
                    for f in [&self.etcd_ca, &self.etcd_cert, &self.etcd_key]
                        .into_iter()
                        .flatten()
                    {
                        if !f.is_file() {
                            bail!("etcd TLS file {} does not exist", f.display());
                        }
                    }
                    opts.tls = Some(EtcdTls {
                        ca: self.etcd_ca.clone(),
                        cert: self.etcd_cert.clone(),
                        key: self.etcd_key.clone(),
                    });
                }
                match (&self.etcd_user, &self.etcd_password_file) {
                    (Some(u), Some(f)) => opts.user = Some((u.clone(), read_password(f)?)),
                    (None, None) => {}
                    _ => bail!("--etcd-user and --etcd-password-file go together"),
                }
                tracing::info!(endpoints = ?opts.endpoints, prefix = %opts.prefix, host_id = %host_id, secrets_key = %secrets.active_id(), retired_keys = ?secrets.retired_ids(), "store: etcd");
                // A lease left by a crashed daemon with this host id may take one lease TTL to
                // expire before the first session starts (`docs/fleet.md`).
                let wait = opts.op_timeout * 2 + opts.lease_ttl + Duration::from_secs(2);
                let store = EtcdStore::open(opts, secrets)?;
                let connected = store.wait_connected(wait).await;
                if let Some(why) = store.refused() {
                    bail!("{why}");
                }
                if !connected {
                    let st = store.status();
                    tracing::warn!(error = st.last_error.as_deref().unwrap_or(""), "etcd does not answer: starting from the local mirror; the store keeps connecting");
                }
                Ok(Arc::new(store))
            }
        }
    }
}
