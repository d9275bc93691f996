//! The per-server gauges of `/metrics` from the servers' live state; their statistics
//! are in `server_stats.rs`.

use std::collections::HashMap;

use super::families::{BindingLabel, Families, HealthLabel, ServerLabel, HEALTH_STATES};
use crate::live_state::LiveState;

/// Clears the per-server families and sets them from `live` (by binding name; `None`: not in live
/// mode, so none are shown).
pub(super) fn set(f: &Families, live: Option<&HashMap<String, LiveState>>) {
    f.live_up.clear();
    f.server_active.clear();
    f.server_fails.clear();
    f.server_down.clear();
    f.server_draining.clear();
    f.server_health.clear();
    f.server_slow_start.clear();
    f.server_stats.set(live);
    let Some(live) = live else { return };
    for (binding, state) in live {
        f.live_up
            .get_or_create(&BindingLabel {
                binding: binding.clone(),
            })
            .set(i64::from(state.error.is_none()));
        for s in &state.servers {
            let label = ServerLabel {
                binding: binding.clone(),
                server: s.address.clone(),
            };
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            f.server_active.get_or_create(&label).set(n(s.active));
            f.server_fails.get_or_create(&label).set(n(s.fails));
            f.server_down.get_or_create(&label).set(i64::from(s.down));
            if let Some(d) = s.drain {
                f.server_draining.get_or_create(&label).set(i64::from(d));
            }
            if let Some(h) = &s.health {
                for state in HEALTH_STATES {
                    f.server_health
                        .get_or_create(&HealthLabel {
                            binding: binding.clone(),
                            server: s.address.clone(),
                            state,
                        })
                        .set(i64::from(h == state));
                }
            }
            if let Some(ms) = s.slow_start_remaining_ms {
                f.server_slow_start
                    .get_or_create(&label)
                    .set(ms as f64 / 1000.0);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::super::{Format, Metrics};
    use crate::live_state::fixtures::{OLD_JSON, PROBED_JSON};
    use crate::live_state::LiveState;
    use crate::live_state::UpstreamState;

    pub(in crate::http::metrics) fn state(json: &str) -> LiveState {
        let s: UpstreamState = serde_json::from_str(json).unwrap();
        LiveState::read("unix:/x.sock:/api/".into(), 0, s)
    }

    pub(in crate::http::metrics) fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    /// What `promtool check metrics` says of `text` ("" when it has no complaint).
    pub(in crate::http::metrics) fn promtool(text: &str) -> String {
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool is missing: scripts/setup.sh installs Debian's prometheus package");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() || !said.is_empty() {
            said
        } else {
            format!("promtool exited with {}", out.status)
        }
    }

    pub(in crate::http::metrics) fn scrape(live: &[(&str, LiveState)]) -> String {
        let m = Metrics::default();
        let map = live
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect();
        m.encode(&[], Some(&map), 0, Format::Prometheus)
    }

    /// A probing module (CONTRACT.md §2): one health series per state, 1 for the server's own;
    /// drain and slow start as gauges; promtool-clean.
    #[test]
    fn probed_servers_give_health_drain_and_slow_start_series() {
        let t = scrape(&[("web", state(PROBED_JSON))]);
        let s = |server: &str, state: &str| {
            value(
                &t,
                &format!(
                    "tributary_server_health{{binding=\"web\",server=\"{server}\",state=\"{state}\"}}"
                ),
            )
        };
        assert_eq!(s("10.0.0.1:80", "healthy"), Some(1.0), "{t}");
        assert_eq!(s("10.0.0.1:80", "unhealthy"), Some(0.0), "{t}");
        assert_eq!(s("10.0.0.2:80", "unhealthy"), Some(1.0), "{t}");
        assert_eq!(s("10.0.0.2:80", "healthy"), Some(0.0), "{t}");
        assert_eq!(s("10.0.0.3:80", "checking"), Some(1.0), "{t}");
        let g = |name: &str, server: &str| {
            value(
                &t,
                &format!("{name}{{binding=\"web\",server=\"{server}\"}}"),
            )
        };
        assert_eq!(g("tributary_server_draining", "10.0.0.4:80"), Some(1.0));
        assert_eq!(g("tributary_server_draining", "10.0.0.1:80"), Some(0.0));
        assert_eq!(
            g("tributary_server_active_connections", "10.0.0.4:80"),
            Some(7.0)
        );
        assert_eq!(g("tributary_server_fails", "10.0.0.2:80"), Some(1.0));
        assert_eq!(
            g(
                "tributary_server_slow_start_remaining_seconds",
                "10.0.0.5:80"
            ),
            Some(12.5)
        );
        assert_eq!(
            value(&t, "tributary_binding_live_up{binding=\"web\"}"),
            Some(1.0)
        );
        let complaints = promtool(&t);
        assert_eq!(complaints, "", "promtool check metrics:\n{complaints}\n{t}");
    }

    /// An older module: active, fails and down only, no health, drain or slow start series; a
    /// binding whose state could not be read: `live_up` 0 and no server series.
    #[test]
    fn an_old_module_and_an_unreadable_one_give_what_they_have() {
        let mut gone = state(OLD_JSON);
        gone.error = Some("cannot reach the live API".into());
        gone.servers.clear();
        let t = scrape(&[("old", state(OLD_JSON)), ("gone", gone)]);
        let g = |name: &str, server: &str| {
            value(
                &t,
                &format!("{name}{{binding=\"old\",server=\"{server}\"}}"),
            )
        };
        assert_eq!(
            g("tributary_server_active_connections", "10.0.0.1:80"),
            Some(3.0)
        );
        assert_eq!(g("tributary_server_fails", "10.0.0.1:80"), Some(2.0));
        assert_eq!(g("tributary_server_down", "10.0.0.2:80"), Some(1.0));
        assert_eq!(g("tributary_server_down", "10.0.0.1:80"), Some(0.0));
        // A module before `drain` drains nothing: the default of an absent `drain`, as in a PUT.
        assert_eq!(g("tributary_server_draining", "10.0.0.1:80"), Some(0.0));
        for absent in [
            "tributary_server_health{",
            "tributary_server_slow_start_remaining_seconds{",
            "binding=\"gone\",server",
        ] {
            assert!(!t.contains(absent), "{absent}\n{t}");
        }
        assert_eq!(
            value(&t, "tributary_binding_live_up{binding=\"old\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tributary_binding_live_up{binding=\"gone\"}"),
            Some(0.0)
        );
        let complaints = promtool(&t);
        assert_eq!(complaints, "", "promtool check metrics:\n{complaints}\n{t}");
    }
}
