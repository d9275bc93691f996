//! Reading upstreams' live state from the module for display (issue 21): what `binding show`, the
//! API's binding view, the binding page and `/metrics` show per server (address, weight, active
//! connections, fails, down, and drain, health and slow start when the module gives them).
//!
//! Read on demand through [`crate::live_api::LiveApi::state`], each read bounded by
//! [`crate::live_api::READ_TIMEOUT`]; a module that cannot be read gives a [`LiveState`] whose
//! `error` says why, never an error of the page that shows it. `/metrics` reads through
//! [`LiveCache`]: at most one read per binding per [`LIVE_TTL`], shared by concurrent scrapes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_store::now_ms;

use crate::engine::LiveOptions;
use crate::live_api::LiveApi;
use crate::view::LiveState;

/// How long `/metrics` reuses a binding's live state before reading it again.
pub const LIVE_TTL: Duration = Duration::from_secs(5);

/// At most this many reads of one scrape run at once.
const PARALLEL_READS: usize = 16;

/// How long a scrape waits for the live states in all.
const SCRAPE_WAIT: Duration = Duration::from_millis(1000);

/// The API live state is read from: `Some` when changes go live (`--apply live|auto` with
/// `--live-api`), the only mode where upstreams have a zone the module can show.
pub fn api_of(opts: &LiveOptions) -> Option<&LiveApi> {
    if opts.zoned() {
        opts.api.as_ref()
    } else {
        None
    }
}

/// The live state of upstream `name` now ([`LiveApi::state`], at most
/// [`crate::live_api::READ_TIMEOUT`]); a failed read is a state with its `error`.
pub async fn read(api: &LiveApi, name: &str) -> LiveState {
    let read_at_ms = now_ms();
    match api.state(name).await {
        Ok(s) => LiveState {
            api: api.to_string(),
            read_at_ms,
            error: None,
            generation: Some(s.generation),
            servers: s.servers,
        },
        Err(e) => LiveState {
            api: api.to_string(),
            read_at_ms,
            error: Some(e),
            generation: None,
            servers: Vec::new(),
        },
    }
}

/// The live states `/metrics` shows, read at most once per [`LIVE_TTL`] (the whole set at once,
/// [`PARALLEL_READS`] reads in flight, at most [`SCRAPE_WAIT`] in all), concurrent scrapes waiting for the one read in progress.
#[derive(Debug, Default)]
pub struct LiveCache {
    inner: tokio::sync::Mutex<Cached>,
}

#[derive(Debug, Default)]
struct Cached {
    at: Option<Instant>,
    names: Vec<String>,
    states: Arc<HashMap<String, LiveState>>,
}

impl LiveCache {
    /// The live state of each of `names` (upstreams of the API `api`), from the cache when it is
    /// younger than [`LIVE_TTL`] and was read for the same names, else read now.
    pub async fn get(&self, api: &LiveApi, names: &[String]) -> Arc<HashMap<String, LiveState>> {
        let mut c = self.inner.lock().await;
        if c.names == names && c.at.is_some_and(|t| t.elapsed() < LIVE_TTL) {
            return c.states.clone();
        }
        let gate = Arc::new(tokio::sync::Semaphore::new(PARALLEL_READS));
        let mut tasks = tokio::task::JoinSet::new();
        for n in names {
            let (api, n, gate) = (api.clone(), n.clone(), gate.clone());
            tasks.spawn(async move {
                let _permit = gate.acquire_owned().await;
                let s = read(&api, &n).await;
                (n, s)
            });
        }
        // The whole scrape waits at most SCRAPE_WAIT: what is not read by then is reported as such.
        let deadline = tokio::time::Instant::now() + SCRAPE_WAIT;
        let mut states = HashMap::with_capacity(names.len());
        while let Ok(Some(r)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
            if let Ok((n, s)) = r {
                states.insert(n, s);
            }
        }
        tasks.abort_all();
        for n in names {
            states.entry(n.clone()).or_insert_with(|| LiveState {
                api: api.to_string(),
                read_at_ms: now_ms(),
                error: Some(format!(
                    "not read within the scrape's {} ms (too many upstreams to read at once)",
                    SCRAPE_WAIT.as_millis()
                )),
                generation: None,
                servers: Vec::new(),
            });
        }
        c.at = Some(Instant::now());
        c.names = names.to_vec();
        c.states = Arc::new(states);
        c.states.clone()
    }
}
