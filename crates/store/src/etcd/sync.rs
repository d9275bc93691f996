//! What a host reads and watches of the prefix (`docs/fleet.md`, "What a host watches"): two key
//! ranges, `[P/bindings/, P/names/)` (bindings, heartbeats, the integrity key) and
//! `[P/resolvers/, P/writes/)` (resolver claims, target sets, `unable` markers of both layouts,
//! `P/unable-by-host/` and `P/unable/`). Not `P/outcomes-by-host/` nor the old layout's
//! `P/outcomes/` (every host's state of every binding: read on demand, `fleet_read.rs`), not
//! `P/writes/` (the writes' markers, `write.rs`), not `P/names/` (the name claims, read by the
//! writes' guards): what a host receives per binding change does not grow with the host count.
//!
//! The session's full read (both ranges at one revision, in pages sized by bytes), its watch (both
//! ranges on one stream, from the revision after the read), and the application of what they
//! return to the mirror.

use std::collections::HashSet;
use std::sync::Arc;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions, WatchResponse};
use tokio::time::timeout;

use super::auth::Meta;
use super::keys::Keys;
use super::mirror::Update;
use super::session::{bounded, MAX_MESSAGE};
use super::{lock, Shared};

/// Most keys in one page of a range read.
const PAGE: i64 = 1000;
/// Bytes (keys and values) one page of a range read aims at: the next page's key count is sized
/// from the bytes per key seen so far, so a prefix of large values (target sets of 60 tagged
/// servers are ≈ 8 KiB each) is read in pages that stay far below [`MAX_MESSAGE`].
const PAGE_BYTES: usize = 2 << 20;

/// The ranges `[start, end)` a host reads and watches (see the module docs). The kinds under the
/// prefix sort as `bindings/ hosts/ integrity names/ outcomes-by-host/ outcomes/ resolvers/
/// targets/ unable-by-host/ unable/ writes/` (`keys.rs` test: outcomes are outside, markers
/// inside).
pub(crate) fn watched_ranges(keys: &Keys) -> [(Vec<u8>, Vec<u8>); 2] {
    let k = |s: &str| format!("{}{s}", keys.prefix).into_bytes();
    [
        (k("bindings/"), k("names/")),
        (k("resolvers/"), k("writes/")),
    ]
}

/// The key count of the next page of a range read, from the bytes per key of this one.
fn next_page(kvs: &[KeyValue]) -> i64 {
    let bytes: usize = kvs.iter().map(|kv| kv.key().len() + kv.value().len()).sum();
    let per_key = (bytes / kvs.len().max(1)).max(1);
    ((PAGE_BYTES / per_key) as i64).clamp(1, PAGE)
}

/// Why a paged read failed: no answer within the operation timeout, or the member's error.
pub(crate) enum ReadError {
    NoAnswer,
    Etcd(etcd_client::Error),
}

/// Reads `[from, end)` in pages at `revision` (0: the newest, then the first page's revision for
/// the rest), calling `each` on every key; returns the revision read at and the cluster id.
pub(crate) async fn read_range(
    shared: &Shared,
    client: &Client,
    from: Vec<u8>,
    end: &[u8],
    revision: i64,
    each: impl FnMut(&KeyValue),
) -> Result<(i64, u64), String> {
    read_pages(shared, client, from, end, revision, false, each)
        .await
        .map_err(|e| match e {
            ReadError::NoAnswer => {
                format!("read prefix: no answer within {:?}", shared.opts.op_timeout)
            }
            ReadError::Etcd(e) => format!("read prefix: {e}"),
        })
}

/// [`read_range`], of the keys only when `keys_only` (their values are not sent), with the
/// error as etcd gave it (a caller may tell a permission refusal from an outage).
pub(crate) async fn read_pages(
    shared: &Shared,
    client: &Client,
    mut from: Vec<u8>,
    end: &[u8],
    mut revision: i64,
    keys_only: bool,
    mut each: impl FnMut(&KeyValue),
) -> Result<(i64, u64), ReadError> {
    let o = &shared.opts;
    let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
    let mut page = PAGE;
    let mut cluster_id = 0u64;
    loop {
        let mut g = GetOptions::new().with_range(end.to_vec()).with_limit(page);
        if revision > 0 {
            g = g.with_revision(revision);
        }
        if keys_only {
            g = g.with_keys_only();
        }
        let r = match timeout(o.op_timeout, kv.get(from.clone(), Some(g))).await {
            Ok(Err(etcd_client::Error::GRpcStatus(e)))
                if e.code() == tonic::Code::OutOfRange && page > 1 =>
            {
                page = (page / 4).max(1);
                continue;
            }
            Ok(r) => r.map_err(ReadError::Etcd)?,
            Err(_) => return Err(ReadError::NoAnswer),
        };
        page = next_page(r.kvs());
        if let Some(h) = r.header() {
            if revision == 0 {
                revision = h.revision();
            }
            cluster_id = h.cluster_id();
        }
        r.kvs().iter().for_each(&mut each);
        match r.kvs().last() {
            Some(last) if r.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok((revision, cluster_id)),
        }
    }
}

fn update_of(kv: &KeyValue, value: Option<Vec<u8>>) -> Update {
    Update::Raw {
        key: kv.key().to_vec(),
        rev: kv.mod_revision(),
        lease: kv.lease(),
        value,
        meta: Meta {
            create_rev: kv.create_revision(),
            version: kv.version(),
        },
    }
}

/// The session's full read: every watched range at one revision. Returns the updates, the keys
/// seen, the revision and the cluster id.
pub(crate) async fn read_watched(
    shared: &Shared,
    client: &Client,
) -> Result<(Vec<Update>, HashSet<String>, i64, u64), String> {
    let mut updates = Vec::new();
    let mut seen = HashSet::new();
    let mut snapshot = 0;
    let mut cluster = 0;
    for (start, end) in watched_ranges(&shared.keys) {
        let (rev, id) = read_range(shared, client, start, &end, snapshot, |kv| {
            seen.insert(String::from_utf8_lossy(kv.key()).into_owned());
            updates.push(update_of(kv, Some(kv.value().to_vec())));
        })
        .await?;
        snapshot = rev;
        cluster = id;
    }
    Ok((updates, seen, snapshot, cluster))
}

/// The watch of every watched range, on one stream, from revision `start`.
pub(crate) async fn watch_ranges(
    shared: &Shared,
    client: &Client,
    start: i64,
) -> Result<etcd_client::WatchStream, String> {
    let opts = |end: Vec<u8>| {
        WatchOptions::new()
            .with_range(end)
            .with_start_revision(start)
            .with_progress_notify()
    };
    let [(s1, e1), (s2, e2)] = watched_ranges(&shared.keys);
    let mut watch = bounded(
        shared,
        "watch",
        client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE)
            .watch(s1, Some(opts(e1))),
    )
    .await?;
    bounded(shared, "watch", watch.watch(s2, Some(opts(e2)))).await?;
    Ok(watch)
}

/// The updates of one watch response.
pub(crate) fn updates_of(resp: &WatchResponse) -> Vec<Update> {
    resp.events()
        .iter()
        .filter_map(|ev| {
            let kv = ev.kv()?;
            let value = (ev.event_type() == EventType::Put).then(|| kv.value().to_vec());
            Some(update_of(kv, value))
        })
        .collect()
}

/// Whether a full read at `revision` of cluster `id` finds etcd gone back: another cluster than
/// the one this process saw, or a revision below the highest it saw (etcd restored from a
/// backup; etcd-io/etcd#16028).
pub(crate) fn went_back(shared: &Shared, id: u64, revision: i64) -> bool {
    let Some((old_id, max)) = *lock(&shared.seen) else {
        return false;
    };
    if old_id == id && revision >= max {
        return false;
    }
    tracing::warn!(store = %shared.location, cluster = %format!("{id:x}"), revision, seen_cluster = %format!("{old_id:x}"), seen_revision = max, "etcd went back (restored from a backup, or another cluster): the mirror is rebuilt from what etcd holds now");
    true
}

/// Applies watched or read changes to the mirror (on a blocking thread: decoding a full read
/// takes a while; nothing waits on the file, `mirror_file.rs`) and emits their events.
/// `snapshot`: a full read (keys seen, revision, whether etcd went back): keys missing from it
/// are removed; when etcd went back, every revision held is forgotten first.
pub(crate) async fn apply_and_emit(
    shared: &Arc<Shared>,
    updates: Vec<Update>,
    snapshot: Option<(HashSet<String>, i64, bool)>,
) -> Result<(), String> {
    let s = shared.clone();
    let events = tokio::task::spawn_blocking(move || super::mirror::apply(&s, updates, snapshot))
        .await
        .map_err(|e| format!("mirror thread: {e}"))?;
    for e in events {
        let _ = shared.events.send(e);
    }
    super::integrity::report_refusals(shared);
    shared.reseal.notify_one();
    Ok(())
}

/// The first key after every key starting with `prefix`.
pub(crate) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
