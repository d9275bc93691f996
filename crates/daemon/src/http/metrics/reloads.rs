//! `tributary_reload_reasons_total{reason}`: changes applied by a reload, by why the live API was
//! not used (the outcome's `reload_reason` tag, never its text). Every reason is listed from the
//! start, at 0.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tributary_store::{Applied, OutcomeRecord, ReloadReason};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The counter family, registered by [`ReloadReasons::register`].
#[derive(Debug, Default)]
pub(super) struct ReloadReasons(Family<ReasonLabel, Counter>);

impl ReloadReasons {
    /// Declares the family in `r`, every reason at 0.
    pub(super) fn register(r: &mut Registry) -> ReloadReasons {
        let family = Family::<ReasonLabel, Counter>::default();
        for reason in ReloadReason::ALL {
            let _ = family.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        r.register(
            "tributary_reload_reasons",
            "Changes applied by a reload, by why the live API was not used (apply_mode, no_live_api, new_upstream, not_rendered, directives_changed, zone_resized, no_zone, host_names, api_down, not_listed, zone_full, live_failed)",
            family.clone(),
        );
        ReloadReasons(family)
    }

    /// Counts `o` when a reload applied it for a known reason.
    pub(super) fn observe(&self, o: &OutcomeRecord) {
        if let (Some(Applied::Reload), Some(reason)) = (o.applied, o.reload_reason) {
            self.0
                .get_or_create(&ReasonLabel {
                    reason: reason.as_str(),
                })
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use tributary_store::{OutcomeStatus, ReloadReason};

    use super::super::{Format, Metrics};
    use crate::engine::EngineEvent;
    use tributary_store::{Applied, OutcomeRecord};

    #[test]
    fn changes_applied_by_a_reload_are_counted_by_their_reason_tag() {
        let m = Metrics::default();
        let applied = |path: Applied, reason: Option<ReloadReason>| EngineEvent::Outcome {
            binding: "api".into(),
            outcome: OutcomeRecord {
                applied: Some(path),
                applied_reason: Some("any words".into()),
                reload_reason: reason,
                ..OutcomeRecord::new(1_000, OutcomeStatus::Ok)
            },
        };
        m.observe(&applied(Applied::Reload, Some(ReloadReason::ZoneResized)));
        m.observe(&applied(Applied::Reload, Some(ReloadReason::ZoneResized)));
        m.observe(&applied(Applied::Reload, Some(ReloadReason::ApiDown)));
        // A live change has no reload reason; an old outcome without a tag is not counted.
        m.observe(&applied(Applied::Live, None));
        m.observe(&applied(Applied::Reload, None));
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let t = m.encode(&[], None, 0, format);
            let n = |r: &str| -> f64 {
                let series = format!("tributary_reload_reasons_total{{reason=\"{r}\"}} ");
                t.lines()
                    .find_map(|l| l.strip_prefix(series.as_str()))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no {series} in:\n{t}"))
            };
            assert_eq!(n("zone_resized"), 2.0);
            assert_eq!(n("api_down"), 1.0);
            // Every reason is listed, also at zero.
            for r in ReloadReason::ALL {
                let _ = n(r.as_str());
            }
            assert_eq!(n("new_upstream"), 0.0);
        }
    }
}
