//! The fleet's series of `/metrics` ("What users running 20–200 hosts need to see";
//! `docs/fleet.md`, "What to watch"), from this host's copy of the store ([`FleetHosts`]): per
//! binding the age of its published set, its interval and who resolves it; per host whether it
//! is alive and how many claims it holds; and how many bindings **this** host is behind. Absent
//! with the SQLite store (one host, no fleet).
//!
//! Everything here is what the host watches (sets, claims, heartbeats) or writes itself (its
//! outcomes), so a scrape reads nothing from etcd: a host does not watch the others' outcomes, and
//! reading them all (hosts × bindings keys) at every scrape of every host would cost etcd more
//! than the watch it replaced. Each host says how far behind it is; Prometheus aggregates the
//! hosts (`max by (host)`), and a host that cannot say (gone) shows as `host_alive` 0 on the others.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::families::{BindingLabel, FloatGauge};
use crate::view::FleetHosts;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HostLabel {
    pub(super) host: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResolverLabel {
    pub(super) binding: String,
    pub(super) host: String,
}

/// The fleet's families, registered next to [`super::families::Families`].
#[derive(Debug, Default)]
pub(super) struct FleetFamilies {
    set_age: Family<BindingLabel, FloatGauge>,
    interval: Family<BindingLabel, Gauge>,
    resolver: Family<ResolverLabel, Gauge>,
    host_alive: Family<HostLabel, Gauge>,
    host_behind: Family<HostLabel, Gauge>,
    host_claims: Family<HostLabel, Gauge>,
}

impl FleetFamilies {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "tributary_fleet_binding_set_age_seconds",
            "Seconds since the binding was last resolved for the fleet as far as this host knows: since its own last successful resolution when it resolves the binding, else since the newest published set was resolved (an unchanged set is not published again). The fleet's age is the minimum over the hosts (absent: never resolved)",
            self.set_age.clone(),
        );
        r.register(
            "tributary_fleet_binding_interval_seconds",
            "The binding's refresh interval (for alerts on the set age)",
            self.interval.clone(),
        );
        r.register(
            "tributary_fleet_binding_resolver",
            "1 for the host holding the binding's resolver claim (absent: no host holds it now)",
            self.resolver.clone(),
        );
        r.register(
            "tributary_fleet_host_alive",
            "1 while the host's heartbeat is live, 0 for a host that is gone but still has outcomes in the store",
            self.host_alive.clone(),
        );
        r.register(
            "tributary_fleet_host_behind_bindings",
            "Bindings with a published target set this host does not serve, shown by each host for itself (its state is not applied at the newest generation: an older set, nginx refused the newest, the store unreachable, or no state)",
            self.host_behind.clone(),
        );
        r.register(
            "tributary_fleet_host_resolver_claims",
            "Resolver claims the host holds",
            self.host_claims.clone(),
        );
    }

    /// Clears every family and sets it from `fleet` (`None`: no fleet, nothing shown).
    pub(super) fn set(&self, fleet: Option<&FleetHosts>) {
        self.set_age.clear();
        self.interval.clear();
        self.resolver.clear();
        self.host_alive.clear();
        self.host_behind.clear();
        self.host_claims.clear();
        let Some(fleet) = fleet else { return };
        for b in &fleet.bindings {
            let label = BindingLabel {
                binding: b.name.clone(),
            };
            if let Some(age) = b.set_age_seconds {
                self.set_age.get_or_create(&label).set(age);
            }
            self.interval
                .get_or_create(&label)
                .set(i64::try_from(b.interval_secs).unwrap_or(i64::MAX));
            if let Some(h) = &b.resolver {
                self.resolver
                    .get_or_create(&ResolverLabel {
                        binding: b.name.clone(),
                        host: h.clone(),
                    })
                    .set(1);
            }
        }
        for h in &fleet.hosts {
            let label = HostLabel {
                host: h.host.clone(),
            };
            let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            self.host_alive
                .get_or_create(&label)
                .set(i64::from(h.alive));
            if h.host == fleet.host_id {
                self.host_behind
                    .get_or_create(&label)
                    .set(n(h.behind_bindings));
            }
            self.host_claims.get_or_create(&label).set(n(h.resolves));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Metrics};
    use crate::view::{FleetBindingSummary, FleetHostSummary, FleetHosts};

    #[test]
    fn the_fleet_series_show_set_ages_resolvers_hosts_and_how_far_this_host_is_behind() {
        let m = Metrics::default();
        let fleet = FleetHosts {
            host_id: "a".into(),
            store: "etcd".into(),
            hosts: vec![
                FleetHostSummary {
                    host: "a".into(),
                    alive: true,
                    behind_bindings: 0,
                    behind: vec![],
                    resolves: 1,
                },
                FleetHostSummary {
                    host: "b".into(),
                    alive: false,
                    behind_bindings: 2,
                    behind: vec!["api".into(), "db".into()],
                    resolves: 0,
                },
            ],
            bindings: vec![
                FleetBindingSummary {
                    name: "api".into(),
                    resolver: Some("a".into()),
                    generation: 3,
                    set_age_seconds: Some(12.5),
                    interval_secs: 10,
                },
                FleetBindingSummary {
                    name: "db".into(),
                    resolver: None,
                    generation: 0,
                    set_age_seconds: None,
                    interval_secs: 30,
                },
            ],
        };
        let t = m.encode_with(&[], None, Some(&fleet), 0, Format::Prometheus);
        for line in [
            "tributary_fleet_binding_set_age_seconds{binding=\"api\"} 12.5",
            "tributary_fleet_binding_interval_seconds{binding=\"db\"} 30",
            "tributary_fleet_binding_resolver{binding=\"api\",host=\"a\"} 1",
            "tributary_fleet_host_alive{host=\"b\"} 0",
            "tributary_fleet_host_behind_bindings{host=\"a\"} 0",
            "tributary_fleet_host_resolver_claims{host=\"a\"} 1",
        ] {
            assert!(t.contains(line), "{line} missing:\n{t}");
        }
        // Another host's count is its own to say (this host does not read its outcomes).
        assert!(!t.contains("host_behind_bindings{host=\"b\"}"), "{t}");
        assert!(!t.contains("set_age_seconds{binding=\"db\"}"), "{t}");
        assert!(!t.contains("binding_resolver{binding=\"db\""), "{t}");
        // No fleet (SQLite): the series are gone at the next scrape.
        let t = m.encode_with(&[], None, None, 0, Format::Prometheus);
        assert!(!t.contains("tributary_fleet_host_alive{"), "{t}");
        assert!(
            !t.contains("tributary_fleet_binding_set_age_seconds{"),
            "{t}"
        );
    }
}
