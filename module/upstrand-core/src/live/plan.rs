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
    /// `drain`
    pub drain: bool,
}

impl Current {
    fn same_settings(&self, s: &Server) -> bool {
        self.weight == s.weight
            && self.max_fails == s.max_fails
            && self.fail_timeout_s == s.fail_timeout_s
            && self.max_conns == s.max_conns
            && self.down == s.down
            && self.drain == s.drain
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
    /// `tries`: peers not marked down (nor drained: their `down` word is not 0 either).
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
        if !s.down && !s.drain {
            t.tries += 1;
        }
    }
    t.single = !backup && t.number == 1 && !wanted.iter().any(|s| s.backup);
    t.weighted = t.total_weight != t.number as u64;
    t
}

/// The tries a request has left once its next try is made in a set other than the one its
/// balancer data was made for: the tries a new request gets in the current set (`fresh`, nginx's
/// `ngx_http_upstream_tries`: servers not `down` in both lists) less the tries this request
/// already made to servers of the current set (`tried_here`, by address, each try counted:
/// servers not `down`, in either list), within what `proxy_next_upstream_tries` (`cap`; 0: no
/// limit) still allows after the `made` tries made in every set.
///
/// The request is treated as a new request of the current set that has already made the tries it
/// made there, so its total stays bounded as in stock nginx while sets keep changing: a set that
/// only changed weights (the same servers) gives nothing back for servers already tried, and
/// over any sequence of sets a request makes at most the sum of the sizes of the distinct server
/// sets it saw — however many generations pass. A set with servers the request has not tried
/// gives tries for those (a request whose server left the set continues with the new servers).
pub fn tries_in_new_set(fresh: usize, tried_here: usize, cap: usize, made: usize) -> usize {
    let left = fresh.saturating_sub(tried_here);
    if cap == 0 {
        left
    } else {
        left.min(cap.saturating_sub(made))
    }
}

#[cfg(test)]
mod tests {
    use super::tries_in_new_set;

    #[test]
    fn tries_in_a_new_set_are_a_new_requests_less_what_was_tried_there() {
        // grown set of 7 new servers after one failed try on a server that left: all 7
        assert_eq!(tries_in_new_set(7, 0, 0, 1), 7);
        // the same 2 servers with another weight, one of them tried: one more, as in stock nginx
        assert_eq!(tries_in_new_set(2, 1, 0, 1), 1);
        // ... and both tried: none (the request ends as stock nginx's does)
        assert_eq!(tries_in_new_set(2, 2, 0, 2), 0);
        // a server tried twice counts twice
        assert_eq!(tries_in_new_set(3, 2, 0, 2), 1);
        // shrunk to one server the request has not tried (its own left the set): one try
        assert_eq!(tries_in_new_set(1, 0, 0, 1), 1);
        // proxy_next_upstream_tries 3 with 2 tries made: one more at most
        assert_eq!(tries_in_new_set(7, 0, 3, 2), 1);
        // the cap is used up: nothing more (and never negative)
        assert_eq!(tries_in_new_set(7, 0, 2, 2), 0);
        assert_eq!(tries_in_new_set(7, 0, 2, 5), 0);
        // an empty new set (every server down) gives nothing
        assert_eq!(tries_in_new_set(0, 0, 0, 1), 0);
        assert_eq!(tries_in_new_set(1, 4, 0, 4), 0);
    }

    /// Plays one request against sets that change before every try; every try fails (hung or
    /// dead servers). `pick(set, k)` is the server the balancer picks for the k-th try in a set
    /// (the balancer's tried bitmap is new in every set, so it may pick a server tried before).
    /// Returns the tries made.
    fn play(sets: &[Vec<u32>], pick: impl Fn(&[u32], usize) -> u32, cap: usize) -> usize {
        let mut tried: Vec<u32> = Vec::new();
        let first = &sets[0];
        let mut left = if cap == 0 {
            first.len()
        } else {
            first.len().min(cap)
        };
        let mut generation = 0;
        while left > 0 {
            let set = &sets[generation % sets.len()];
            let here = tried.iter().filter(|a| set.contains(a)).count();
            if generation > 0 {
                left = tries_in_new_set(set.len(), here, cap, tried.len());
                if left == 0 {
                    break;
                }
            }
            tried.push(pick(set, tried.len()));
            left -= 1;
            generation += 1;
            assert!(tried.len() < 10_000, "unbounded");
        }
        tried.len()
    }

    #[test]
    fn tries_stay_bounded_while_sets_keep_changing() {
        // weights flipping on the same 2 servers, a new generation before every try: 2 tries
        // (stock nginx: 2), whichever server the balancer picks
        let same = vec![vec![1, 2]; 2];
        assert_eq!(play(&same, |s, _| s[0], 0), 2);
        assert_eq!(play(&same, |s, k| s[k % s.len()], 0), 2);
        // two disjoint sets alternating: at most the sum of their sizes
        let alt = vec![vec![1, 2], vec![3, 4, 5]];
        assert!(play(&alt, |s, _| s[0], 0) <= 5);
        assert!(play(&alt, |s, k| s[k % s.len()], 0) <= 5);
        // a set that grew away from the tried server gets all its new servers
        let grown = vec![vec![9, 8], vec![1, 2, 3, 4, 5, 6, 7]];
        let mut only_grown = grown.clone();
        only_grown.extend(std::iter::repeat_n(grown[1].clone(), 20));
        assert_eq!(
            play(&only_grown, |s, k| s[(k + s.len() - 1) % s.len()], 0),
            8
        );
        // proxy_next_upstream_tries bounds it too
        assert_eq!(play(&alt, |s, k| s[k % s.len()], 3), 3);
    }
}
