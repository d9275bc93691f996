//! The fleet store at scale: one real 3-member etcd cluster, N simulated hosts (EtcdStore
//! instances in this process), B bindings. Measures the store layer's share of the fleet
//! benchmark (`crates/daemon/benches/fleet.rs`): time for a binding change and for a published target set to reach every host's
//! mirror (from the start of the write on one host until every mirror has it), resolver claims per binding (one host each, spread), etcd requests per second at rest,
//! and memory.
//!
//! `cargo bench -p tributary-store --bench fleet` (env: `FLEET_HOSTS`, default 20;
//! `FLEET_BINDINGS`, default 1000).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingRecord, BindingStore, EtcdOptions, EtcdStore, SecretKeys, TargetSet};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn binding(i: usize, service: &str) -> BindingRecord {
    BindingRecord {
        name: format!("b{i:05}"),
        plugin: "consul".into(),
        provider: "consul".into(),
        config: BTreeMap::from([("acl_token".to_string(), serde_json::json!("secret"))]),
        service: service.into(),
        interval_secs: 60,
        directives: vec![],
        drain_secs: 0,
        probe: None,
    }
}

/// Sum of gRPC messages received by every member (etcd's /metrics).
fn grpc_messages(cluster: &EtcdCluster) -> f64 {
    let mut total = 0.0;
    for ep in cluster.endpoints() {
        let port: u16 = ep.rsplit(':').next().unwrap().parse().unwrap();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        for line in text.lines() {
            if line.starts_with("grpc_server_msg_received_total{") {
                total += line
                    .rsplit(' ')
                    .next()
                    .unwrap()
                    .parse::<f64>()
                    .unwrap_or(0.0);
            }
        }
    }
    total
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn until_all(
    hosts: &[Arc<EtcdStore>],
    limit: Duration,
    f: impl Fn(&EtcdStore) -> bool,
) -> Duration {
    let t0 = Instant::now();
    while !hosts.iter().all(|h| f(h)) {
        assert!(t0.elapsed() < limit, "not reached within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    t0.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n_hosts = env("FLEET_HOSTS", 20);
    let n_bindings = env("FLEET_BINDINGS", 1000);
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    let rss0 = rss_kib(std::process::id());
    let mut hosts = Vec::new();
    for i in 0..n_hosts {
        let id = format!("host-{i:02}");
        let opts = EtcdOptions::new(
            cluster.endpoints(),
            "/bench/",
            &id,
            &dir.path().join(format!("{id}.db")),
        );
        let keys = SecretKeys::from_bytes(&[&[1u8; 32]]).unwrap();
        hosts.push(Arc::new(EtcdStore::open(opts, keys).unwrap()));
    }
    until_all(&hosts, Duration::from_secs(60), |h| h.status().connected).await;
    let list: Vec<BindingRecord> = (0..n_bindings).map(|i| binding(i, "v1")).collect();
    let t0 = Instant::now();
    hosts[0].upsert_bindings(&list).await.unwrap();
    let write = t0.elapsed();
    let all = until_all(&hosts, Duration::from_secs(120), |h| {
        h.list_bindings().unwrap().len() == n_bindings
    })
    .await;
    println!(
        "{n_bindings} bindings written by one host in {write:?}; on all {n_hosts} hosts {:?} after",
        all
    );

    // Claims: every host asks for every binding, as at a refresh.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    let mut per_host = vec![0usize; n_hosts];
    for b in &list {
        for (i, h) in hosts.iter().enumerate() {
            if h.claim_resolver(&b.name).await.unwrap() {
                per_host[i] += 1;
            }
        }
    }
    let claimed: usize = per_host.iter().sum();
    println!(
        "claims: {claimed} resolvers for {n_bindings} bindings (one per binding wanted) in {:?}; per host min {} max {}",
        t0.elapsed(),
        per_host.iter().min().unwrap(),
        per_host.iter().max().unwrap()
    );
    // A second round, as at the next interval: no etcd request for a held claim.
    let m0 = tokio::task::block_in_place(|| grpc_messages(&cluster));
    let mut again = 0;
    for b in &list {
        for h in &hosts {
            if h.claim_resolver(&b.name).await.unwrap() {
                again += 1;
            }
        }
    }
    let m1 = tokio::task::block_in_place(|| grpc_messages(&cluster));
    println!(
        "second round: {again} resolvers, {} etcd messages for {} claim calls",
        m1 - m0,
        n_bindings * n_hosts
    );

    // A binding change, and a target set, reaching every host (median of 20).
    let mut change = Vec::new();
    let mut targets = Vec::new();
    for round in 0..20 {
        let b = binding(round, &format!("v{}", round + 2));
        let t0 = Instant::now();
        hosts[round % n_hosts]
            .upsert_bindings(std::slice::from_ref(&b))
            .await
            .unwrap();
        until_all(&hosts, Duration::from_secs(30), |h| {
            h.get_binding(&b.name)
                .unwrap()
                .is_some_and(|s| s.binding.service == b.service)
        })
        .await;
        change.push(t0.elapsed());
        let resolver = hosts
            .iter()
            .find(|h| h.fleet_view(&b.name).resolver.as_deref() == Some(h.host_id()))
            .unwrap();
        let set = TargetSet {
            resolved_by: String::new(),
            at_ms: round as i64,
            // Resolved from the version the resolver holds (another version's set is refused).
            binding_updated_at_ms: resolver
                .get_binding(&b.name)
                .unwrap()
                .unwrap()
                .updated_at_ms,
            targets: vec![
                serde_json::json!({"address": format!("10.0.0.{round}"), "port": 80, "weight": 1}),
            ],
            dropped: vec![],
            ttl_seconds: None,
            generation: 0,
        };
        let t0 = Instant::now();
        resolver.publish_targets(&b.name, &set).await.unwrap();
        until_all(&hosts, Duration::from_secs(30), |h| {
            h.published_targets(&b.name)
                .is_some_and(|t| t.targets == set.targets)
        })
        .await;
        targets.push(t0.elapsed());
    }
    println!(
        "a binding change on all {n_hosts} mirrors: median {:?}, max {:?}",
        median(change.clone()),
        change.iter().max().unwrap()
    );
    println!(
        "a target set on all {n_hosts} mirrors: median {:?}, max {:?}",
        median(targets.clone()),
        targets.iter().max().unwrap()
    );

    // At rest: only keep-alives (every TTL/3 per host).
    let m0 = tokio::task::block_in_place(|| grpc_messages(&cluster));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m1 = tokio::task::block_in_place(|| grpc_messages(&cluster));
    println!(
        "at rest: {:.1} etcd messages/s for {n_hosts} hosts",
        (m1 - m0) / 10.0
    );
    let rss = rss_kib(std::process::id());
    println!(
        "RSS of this process (all {n_hosts} stores): {} MiB ({} KiB per host over the {} MiB before)",
        rss / 1024,
        (rss.saturating_sub(rss0)) / n_hosts as u64,
        rss0 / 1024
    );
}
