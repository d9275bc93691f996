//! Reading upstreams' live state from the module for display: what `binding show`, the
//! API's binding view, the binding page and `/metrics` show per server (address, weight, active
//! connections, fails, down, and drain, health, slow start, the server's id and its statistics —
//! requests, responses by class, bytes, failures, response times — when the module gives them).
//!
//! Read on demand through [`LiveApi::read_set`], each read bounded by
//! [`crate::live_api::READ_TIMEOUT`]; a module that cannot be read gives a [`LiveState`] whose
//! `error` says why, never an error of the page that shows it. `/metrics` reads through
//! [`LiveCache`]: at most one read per binding per [`LIVE_TTL`], shared by concurrent scrapes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_store::now_ms;

use crate::live_api::LiveApi;

#[cfg(test)]
pub(crate) mod fixtures;
mod state;

pub use state::{Badge, LiveState, RetiredState, ServerState, ServerStats, UpstreamState};

/// How long `/metrics` reuses a binding's live state before reading it again.
pub const LIVE_TTL: Duration = Duration::from_secs(5);

/// At most this many reads of one scrape run at once.
const PARALLEL_READS: usize = 16;

/// How long a scrape waits for the live states in all.
const SCRAPE_WAIT: Duration = Duration::from_millis(1000);

/// The live state of upstream `name` now ([`LiveApi::read_set`], at most
/// [`crate::live_api::READ_TIMEOUT`]); a failed read is a state with its `error`.
pub async fn read(api: &LiveApi, name: &str) -> LiveState {
    let read_at_ms = now_ms();
    match api.read_set::<UpstreamState>(name).await {
        Ok(s) => LiveState::read(api.to_string(), read_at_ms, s),
        Err(e) => LiveState::failed(api.to_string(), read_at_ms, e.to_string()),
    }
}

/// The live states `/metrics` shows, read at most once per [`LIVE_TTL`] (the whole set at once,
/// [`PARALLEL_READS`] reads in flight, at most [`SCRAPE_WAIT`] in all), concurrent scrapes waiting
/// for the one read in progress.
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
            states.entry(n.clone()).or_insert_with(|| {
                let why = format!(
                    "not read within the scrape's {} ms (too many upstreams to read at once)",
                    SCRAPE_WAIT.as_millis()
                );
                LiveState::failed(api.to_string(), now_ms(), why)
            });
        }
        c.at = Some(Instant::now());
        c.names = names.to_vec();
        c.states = Arc::new(states);
        c.states.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    use super::*;

    /// A unix socket answering every request with `OLD_JSON` (when `answer`) or never answering;
    /// counts the connections.
    fn module(dir: &std::path::Path, answer: bool) -> (LiveApi, Arc<AtomicUsize>) {
        let path = dir.join("api.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                if !answer {
                    held.push(s);
                    continue;
                }
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = fixtures::OLD_JSON;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(body.as_bytes()).await;
                });
            }
        });
        let api = LiveApi::parse(&format!("unix:{}:/api/", path.display())).unwrap();
        (api, seen)
    }

    /// A module that accepts and never answers: the read gives up after READ_TIMEOUT and says so.
    #[tokio::test]
    async fn a_module_that_never_answers_is_an_error_after_the_read_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let (api, _) = module(dir.path(), false);
        let t0 = Instant::now();
        let s = read(&api, "web").await;
        let took = t0.elapsed();
        let why = s.error.unwrap();
        assert!(why.contains("did not answer within 800 ms"), "{why}");
        assert!(s.servers.is_empty());
        // A correctness bound (the timeout is enforced), not a speed target.
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    /// Scrapes within the TTL reuse the states read: one GET per binding, not one per scrape.
    #[tokio::test]
    async fn the_cache_reads_each_binding_once_per_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let (api, seen) = module(dir.path(), true);
        let cache = LiveCache::default();
        let names = vec!["web".to_string(), "api".to_string()];
        for _ in 0..5 {
            let states = cache.get(&api, &names).await;
            assert_eq!(states.len(), 2);
            assert_eq!(states["web"].error, None, "{:?}", states["web"]);
            assert_eq!(states["api"].servers.len(), 2);
        }
        assert_eq!(seen.load(Ordering::SeqCst), 2, "one read per binding");
        // Another set of bindings is read again.
        let states = cache.get(&api, &names[..1]).await;
        assert_eq!(states.len(), 1);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
    }
}
