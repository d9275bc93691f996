//! What a reload run checks: the configuration generation of each answer and walk (`Generation`,
//! `classify`), the RSS figures of the master and workers, and the report.

use super::*;

/// What generation `g` of the configuration contains.
#[derive(Debug, Clone)]
pub(super) struct Generation {
    /// Normal members of upstrand `us1` (the backup `ok` is always there).
    pub(super) members: Vec<&'static str>,
    /// `us1` lists its members through the regex `~^u` (then all four).
    pub(super) regex: bool,
    /// The `order` line.
    pub(super) order: &'static str,
    /// Members blacklisted for 1 s after a failure.
    pub(super) blacklist: bool,
    /// Upstrand `us2` (members u3, u4, backup ok) exists.
    pub(super) us2: bool,
    /// Status of backend `b{i+1}`.
    pub(super) status: [u16; 4],
}

impl Generation {
    pub(super) fn new(g: usize) -> Generation {
        let regex = g % 7 == 3;
        let mut members: Vec<&'static str> = MEMBERS
            .iter()
            .enumerate()
            .filter(|(i, _)| ((g + 1) >> i) & 1 == 1)
            .map(|(_, m)| *m)
            .collect();
        if regex || members.is_empty() {
            members = MEMBERS.to_vec();
        }
        let status = [1, 2, 3, 4].map(|i| if (g + i) % 3 == 0 { 503 } else { 200 });
        Generation {
            members,
            regex,
            order: [
                "",
                "order start_random;",
                "order per_request;",
                "order start_random per_request;",
            ][g % 4],
            blacklist: g % 5 == 1,
            us2: g % 2 == 0,
            status,
        }
    }

    /// The `http {}` body of this generation.
    pub(super) fn config(&self, g: usize) -> String {
        let bl = if self.blacklist {
            " blacklist_interval=1s"
        } else {
            ""
        };
        let members: String = if self.regex {
            format!("upstream ~^u{bl}; ")
        } else {
            self.members
                .iter()
                .map(|m| format!("upstream {m}{bl}; "))
                .collect()
        };
        let us2 = if self.us2 {
            "upstrand us2 { upstream u3; upstream u4; upstream ok backup; \
             next_upstream_statuses 5xx; }"
        } else {
            ""
        };
        let fillers: String = (0..FILLERS)
            .map(|i| {
                format!(
                    "upstream f{i} {{ add_upstream u{a}; add_upstream u{b} backup; \
                     server 127.0.0.1:{{P5}}; combine_server_singlets _s_; }}
                     upstrand fs{i} {{ upstream ~^f{i}_s_; upstream ~^u{bl}; {order} \
                     next_upstream_statuses 5xx; }}\n",
                    a = i % 4 + 1,
                    b = (i + g) % 4 + 1,
                    order = self.order,
                )
            })
            .collect();
        let backends: String = (0..4)
            .map(|i| {
                format!(
                    "server {{ listen 127.0.0.1:{{P{p}}}; access_log off; \
                     return {s} \"b{p}\"; }}\n",
                    p = i + 1,
                    s = self.status[i]
                )
            })
            .collect();
        // The front talks to the members without keep-alive, on every nginx: from 1.29.7 nginx
        // keeps upstream connections alive by default (HTTP/1.1, `keepalive` on), and as the
        // backends are this nginx's own server blocks, every reload's retiring workers close the
        // front's idle cached connections; a request that nginx sends on one at that moment
        // fails and nginx retries it inside the member (`(u1) 502, 200`). That is nginx's
        // documented keep-alive race, not the upstrand's; setting the pre-1.29.7 defaults
        // explicitly keeps one strict classifier (any 502 inside a member is unexplained).
        format!(
            "map $host $generation {{ default {g}; }}
             log_format rl '$generation|$request_uri|$status|$upstrand_path|$upstrand_status';
             upstream u1 {{ server 127.0.0.1:{{P1}}; }}
             upstream u2 {{ server 127.0.0.1:{{P2}}; }}
             upstream u3 {{ server 127.0.0.1:{{P3}}; }}
             upstream u4 {{ server 127.0.0.1:{{P4}}; }}
             upstream ok {{ server 127.0.0.1:{{P5}}; }}
             upstrand us1 {{ {members}upstream ok backup; {order} next_upstream_statuses 5xx; }}
             {us2}
             {fillers}
             server {{ listen 127.0.0.1:{{P0}};
                       access_log {{PREFIX}}/logs/front.log rl;
                       proxy_http_version 1.0; proxy_set_header Connection close;
                       location /s {{ proxy_pass http://$upstrand_us1; }}
                       location /d {{ dynamic_upstrand $dus $arg_u; proxy_pass http://$dus; }} }}
             server {{ listen 127.0.0.1:{{P5}}; access_log off; return 200 \"ok\"; }}
             {backends}",
            order = self.order,
        )
    }
}

/// Outcome of one access-log line against its generation.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
pub(super) enum Verdict {
    /// 200 through a walk its generation explains.
    Ok,
    /// 500 for `dynamic_upstrand` naming `us2` in a generation without it.
    ExplainedMissingUpstrand,
    /// 499 in the last generation: wrk closed its connections when it was stopped.
    ClientGoneAtEnd,
    /// Anything else.
    Unexplained,
}

/// Classifies one line `generation|uri|status|path|statuses`; `last` is the generation that
/// ran when the load stopped.
pub(super) fn classify(line: &str, gens: &[Generation], last: usize) -> Verdict {
    let f: Vec<&str> = line.split('|').collect();
    let Some((g, gen)) = f
        .first()
        .and_then(|g| g.parse::<usize>().ok())
        .and_then(|g| Some((g, gens.get(g)?)))
    else {
        return Verdict::Unexplained;
    };
    let [_, uri, status, path, statuses] = f[..] else {
        return Verdict::Unexplained;
    };
    if status == "499" && g == last {
        return Verdict::ClientGoneAtEnd;
    }
    let via_us2 = uri == "/d?u=us2";
    if via_us2 && !gen.us2 {
        return if status == "500" && path == "-" {
            Verdict::ExplainedMissingUpstrand
        } else {
            Verdict::Unexplained
        };
    }
    if status != "200" {
        return Verdict::Unexplained;
    }
    let allowed: BTreeSet<&str> = if via_us2 {
        ["u3", "u4", "ok"].into()
    } else {
        gen.members.iter().copied().chain(["ok"]).collect()
    };
    let walked: Vec<&str> = path.split(" -> ").collect();
    // `(u1) 503 (ok) 200`: every step but the last moved on after a 5xx, the last answered 200.
    let codes: Vec<&str> = statuses.split(' ').skip(1).step_by(2).collect();
    let consistent = walked.iter().all(|m| allowed.contains(m))
        && codes.len() == walked.len()
        && codes.last() == Some(&"200")
        && codes[..codes.len() - 1].iter().all(|c| c.starts_with('5'));
    if consistent {
        Verdict::Ok
    } else {
        Verdict::Unexplained
    }
}

/// RSS in KiB of each pid (0 when gone).
pub(super) fn rss(pids: &[u32]) -> Vec<u64> {
    pids.iter()
        .map(|p| procfs::rss_kib(*p).unwrap_or(0))
        .collect()
}

pub(super) fn median(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

/// Figures of one run, printed at the end of the case.
#[derive(Debug, Default)]
pub(super) struct Figures {
    pub(super) reloads: usize,
    pub(super) seconds: f64,
    pub(super) wrk: WrkReport,
    pub(super) verdicts: BTreeMap<Verdict, usize>,
    pub(super) master_rss_start: u64,
    pub(super) master_rss_warm: u64,
    pub(super) master_rss_end: u64,
    /// `(reload, KiB)` every 20 reloads.
    pub(super) master_rss_trend: Vec<(usize, u64)>,
    /// `(reload, median KiB)` of the workers every 20 reloads (before that reload).
    pub(super) worker_rss_trend: Vec<(usize, u64)>,
    pub(super) worker_rss_first: Vec<u64>,
    pub(super) worker_rss_warm: Vec<u64>,
    pub(super) worker_rss_last: Vec<u64>,
    pub(super) worker_exit_max_ms: u128,
}

pub(super) fn report(name: &str, f: &Figures) {
    let served: usize = f.verdicts.values().sum();
    println!(
        "{name}: {} reloads in {:.1} s; wrk: {} requests, {} non-2xx/3xx, socket errors connect {} \
         read {} write {} timeout {}; access log: {served} answers, {} ok, {} explained 500 (us2 \
         absent), {} 499 when wrk stopped, {} unexplained; slowest old generation exit {} ms",
        f.reloads,
        f.seconds,
        f.wrk.requests,
        f.wrk.non_2xx_3xx,
        f.wrk.connect_errors,
        f.wrk.read_errors,
        f.wrk.write_errors,
        f.wrk.timeouts,
        f.verdicts.get(&Verdict::Ok).unwrap_or(&0),
        f.verdicts
            .get(&Verdict::ExplainedMissingUpstrand)
            .unwrap_or(&0),
        f.verdicts.get(&Verdict::ClientGoneAtEnd).unwrap_or(&0),
        f.verdicts.get(&Verdict::Unexplained).unwrap_or(&0),
        f.worker_exit_max_ms,
    );
    let warm = WARMUP_RELOADS.min(f.reloads);
    println!(
        "{name}: RSS master {} KiB at start, {} KiB after {warm} reloads, {} KiB after {} (every \
         20 reloads: {:?}); workers {:?} KiB (first generation), {:?} KiB (generation {warm}), \
         {:?} KiB (last); worker median every 20 reloads: {:?}",
        f.master_rss_start,
        f.master_rss_warm,
        f.master_rss_end,
        f.reloads,
        f.master_rss_trend,
        f.worker_rss_first,
        f.worker_rss_warm,
        f.worker_rss_last,
        f.worker_rss_trend,
    );
}
