//! The plan of a `PUT`: which of the zone's peers stay (keeping their run-time state), which are
//! new and which go (retired while requests still use them).

use std::collections::HashMap;

use super::render::ChangedNames;
use super::{Addr, Server};

/// A peer now in the zone, as the module read it (primary list first, then backup list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// Its address.
    pub addr: Addr,
    /// `weight`
    pub weight: u32,
    /// `max_fails`
    pub max_fails: u32,
    /// `fail_timeout` in seconds.
    pub fail_timeout_s: u32,
    /// `max_conns` (0: no limit).
    pub max_conns: u32,
    /// In the backup list.
    pub backup: bool,
    /// `down`
    pub down: bool,
}

impl Current {
    fn same_settings(&self, s: &Server) -> bool {
        self.weight == s.weight
            && self.max_fails == s.max_fails
            && self.fail_timeout_s == s.fail_timeout_s
            && self.max_conns == s.max_conns
            && self.down == s.down
    }
}

/// What to do to turn the current set into the wanted one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The wanted set equals the current one (same addresses, lists and settings; order aside):
    /// nothing to do, the generation stays.
    pub unchanged: bool,
    /// `(current index, wanted index)`: the same address in the same list (primary/backup); the
    /// peer stays (its failures, connections and round-robin weights are kept) and takes the
    /// wanted settings.
    pub keep: Vec<(usize, usize)>,
    /// Wanted indices that need a new peer.
    pub add: Vec<usize>,
    /// Current indices that leave the set (freed at once when idle, else retired).
    pub remove: Vec<usize>,
}

impl Plan {
    /// The addresses this plan adds and removes (`current` and `wanted` are the ones it was made
    /// from).
    pub fn names(&self, current: &[Current], wanted: &[Server]) -> ChangedNames {
        ChangedNames {
            added: self.add.iter().map(|&j| wanted[j].addr.name()).collect(),
            removed: self
                .remove
                .iter()
                .map(|&i| current[i].addr.name())
                .collect(),
        }
    }
}

/// Plans the change from `current` to `wanted`. A server that moves between the primary and the
/// backup list is removed and added (it starts with fresh state in its new list).
pub fn plan(current: &[Current], wanted: &[Server]) -> Plan {
    let mut by_key: HashMap<(&Addr, bool), usize> = HashMap::new();
    for (i, c) in current.iter().enumerate() {
        by_key.insert((&c.addr, c.backup), i);
    }
    let mut p = Plan::default();
    let mut kept = vec![false; current.len()];
    let mut same = current.len() == wanted.len();
    for (j, w) in wanted.iter().enumerate() {
        match by_key.get(&(&w.addr, w.backup)) {
            Some(&i) if !kept[i] => {
                kept[i] = true;
                same &= current[i].same_settings(w);
                p.keep.push((i, j));
            }
            _ => {
                same = false;
                p.add.push(j);
            }
        }
    }
    p.remove = kept
        .iter()
        .enumerate()
        .filter(|(_, k)| !**k)
        .map(|(i, _)| i)
        .collect();
    p.unchanged = same && p.remove.is_empty() && p.add.is_empty();
    p
}

/// Figures nginx keeps per peer list (`ngx_http_upstream_rr_peers_t`), computed the way
/// `ngx_http_upstream_init_round_robin` does for servers of one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListTotals {
    /// `number`: peers in the list.
    pub number: usize,
    /// `total_weight`: sum of weights.
    pub total_weight: u64,
    /// `tries`: peers not marked down.
    pub tries: usize,
    /// `single`: exactly one peer and no backup list in use (nginx never marks a single peer
    /// failed and gives up without trying backups, so a set with backups is never single).
    pub single: bool,
    /// `weighted`: some weight differs from 1.
    pub weighted: bool,
}

/// The totals of the servers of `wanted` in one list (`backup` false: primary).
pub fn totals(wanted: &[Server], backup: bool) -> ListTotals {
    let mut t = ListTotals::default();
    for s in wanted.iter().filter(|s| s.backup == backup) {
        t.number += 1;
        t.total_weight += u64::from(s.weight);
        if !s.down {
            t.tries += 1;
        }
    }
    t.single = !backup && t.number == 1 && !wanted.iter().any(|s| s.backup);
    t.weighted = t.total_weight != t.number as u64;
    t
}

/// The tries a request continues with once its next try is made in a set other than the one its
/// balancer data was made for: as many as a new request gets in the current set (`fresh`,
/// nginx's `ngx_http_upstream_tries`: servers not `down` in both lists), limited by what
/// `proxy_next_upstream_tries` (`cap`; 0: no limit) still allows after the `made` tries already
/// made, and never fewer than it had left (`left`). Keeping only `left` would end a request
/// whose set grew after one failed try with a 502 while the new set has working servers.
pub fn tries_in_new_set(left: usize, fresh: usize, cap: usize, made: usize) -> usize {
    let allowed = if cap == 0 {
        fresh
    } else {
        fresh.min(cap.saturating_sub(made))
    };
    left.max(allowed)
}
