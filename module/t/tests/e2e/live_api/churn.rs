//! Change cycles of a large server set, shared by the short form in the live API tests
//! (`scale_set_churn_leaves_zone_and_workers_flat`) and the long form, the scale benchmark
//! (`module/t/bench/live_scale.rs`).
//!
//! A set of `n` servers on made-up addresses (`10.X.Y.Z:8080`: nothing is proxied to them; the
//! API does not connect) changes in rounds of two `PUT`s: an *odd* `PUT` removes a block of
//! `part` servers, adds `part` servers on addresses never used before and gives another block of
//! `part` servers a new weight; the *even* `PUT` after it is the base set again (the removed block
//! back as new peers, the added ones removed, the weights back to 1). `part` is 1 % of the set (at
//! least 1) and the blocks move along the set from round to round. After every even `PUT` the set
//! equals the base set, so the zone's slab figures must be the same.

use std::fs;

use ngx_harness::{check_eq, Failed};

use super::master::Master;

/// The servers a change touches in each of its three ways: 1 % of the set, at least 1.
pub fn part_of(n: usize) -> usize {
    (n / 100).max(1)
}

/// The zone size (bytes, a power of two, at least 256 KiB) for a set of `n` servers that takes
/// these cycles: about 1 KiB per server for the set and its `part` new ones (a server takes about
/// 800 bytes; no traffic, so removed servers are freed at once) and 64 KiB for nginx's own use,
/// doubled for head room.
pub fn zone_bytes(n: usize) -> usize {
    (2 * (64 * 1024 + (n + part_of(n)) * 1024))
        .next_power_of_two()
        .max(256 * 1024)
}

/// The address of server `i` of the base set of upstream number `u`.
fn base_addr(u: usize, i: usize) -> String {
    format!("10.{}.{}.{}:8080", u % 100, i / 250, i % 250 + 1)
}

/// The address of the `k`-th server added by the cycles (never the same twice, never a base one).
fn fresh_addr(k: u64) -> String {
    format!(
        "10.{}.{}.{}:8080",
        100 + (k / 62_500) % 150,
        (k / 250) % 250,
        k % 250 + 1
    )
}

/// The cycles of one upstream.
pub struct Churn {
    /// Upstream name.
    pub name: String,
    /// Its index (the second octet of its base addresses).
    index: usize,
    /// Servers of the base set.
    pub n: usize,
    /// `PUT`s made so far.
    pub puts: u64,
    /// The number of the next fresh address.
    fresh: u64,
}

impl Churn {
    /// Cycles of upstream `name` (number `index`: its base addresses) with `n` servers; fresh
    /// addresses start at `fresh_start` (give each upstream its own range).
    pub fn new(name: &str, index: usize, n: usize, fresh_start: u64) -> Churn {
        Churn {
            name: name.to_string(),
            index,
            n,
            puts: 0,
            fresh: fresh_start,
        }
    }

    /// The `PUT`s of the warm-up: until the changed blocks moved along the whole set once (every
    /// base server removed and added back once), at least 4. From then on, the slab figures on
    /// the base set stay the same (measured: a 1,000-server set's `pages_free` is one page higher
    /// after 4 `PUT`s than from about 200 on: freed peers' chunks are spread differently over the
    /// pages until every peer has been reallocated once).
    pub fn warm_up_puts(&self) -> u64 {
        (2 * (self.n / part_of(self.n)) as u64).max(4)
    }

    /// The body of the base set.
    pub fn base_body(&self) -> String {
        let s: Vec<String> = (0..self.n)
            .map(|i| format!(r#"{{"address":"{}"}}"#, base_addr(self.index, i)))
            .collect();
        format!(r#"{{"servers":[{}]}}"#, s.join(","))
    }

    /// The body of the next `PUT` (odd: changed set; even: base set) and whether it is the base.
    pub fn next_body(&mut self) -> (String, bool) {
        self.puts += 1;
        if self.puts % 2 == 0 {
            return (self.base_body(), true);
        }
        let n = self.n;
        let part = part_of(n);
        let round = (self.puts / 2) as usize;
        // The removed block and the reweighted block, moving along the set.
        let removed_at = (round * part) % n;
        let reweighted_at = (removed_at + part) % n;
        let in_block = |i: usize, at: usize| (i + n - at) % n < part;
        let mut s: Vec<String> = Vec::with_capacity(n + part);
        for i in 0..n {
            if in_block(i, removed_at) {
                continue;
            }
            let w = if n > part && in_block(i, reweighted_at) {
                2 + round % 5
            } else {
                1
            };
            s.push(format!(
                r#"{{"address":"{}","weight":{w}}}"#,
                base_addr(self.index, i)
            ));
        }
        for _ in 0..part {
            s.push(format!(r#"{{"address":"{}"}}"#, fresh_addr(self.fresh)));
            self.fresh += 1;
        }
        (format!(r#"{{"servers":[{}]}}"#, s.join(",")), false)
    }
}

/// `upstream` blocks for `churns` (each with its own zone sized by [`zone_bytes`]), starting
/// with one configured server each, and the API location on `{P0}` with a body limit large
/// enough for their `PUT`s.
pub fn config(churns: &[Churn]) -> String {
    let mut c = String::new();
    for ch in churns {
        c.push_str(&format!(
            "upstream {name} {{ zone {name} {}; server 127.0.0.1:{{P1}}; }}\n",
            zone_bytes(ch.n),
            name = ch.name
        ));
    }
    c.push_str(
        "server { listen 127.0.0.1:{P0} reuseport;\n\
         location /api/ { allow 127.0.0.1; deny all; client_max_body_size 8m; \
         client_body_buffer_size 1m; upstreams_api write=on; }\n}\n",
    );
    c
}

/// The slab figures that must come back: (`chunks_used`, `pages_free`, `alloc_failures`).
pub fn slab_figures(m: &Master, name: &str) -> Result<(u64, u64, u64), Failed> {
    let s = m.get_json(&format!("/{name}?slab"))?;
    let f = |k: &str| s[k].as_u64().ok_or_else(|| format!("no {k} in {s}"));
    Ok((f("chunks_used")?, f("pages_free")?, f("alloc_failures")?))
}

/// Memory of one worker in KiB: (`VmRSS`, `RssAnon`: its private memory, without the zone's
/// shared pages it touched).
pub fn worker_memory(pid: u32) -> (u64, u64) {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// `PUT`s `body` to `churn`'s upstream and checks the answer is 200.
pub fn put_ok(m: &Master, name: &str, body: &str) -> Result<(), Failed> {
    let r = m.put(name, body)?;
    check_eq(r.status, 200, &format!("PUT /api/{name} ({})", r.text()))
}
