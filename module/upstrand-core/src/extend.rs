//! `extend_single_peers;`: which fake `down` peers to add so that a lone peer can fail.

/// Fake peers to add to an upstream before its balancer builds its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtendPlan {
    /// Add a fake `down` server to the backup part.
    pub fake_backup: bool,
    /// Add a fake `down` server to the primary part.
    pub fake_primary: bool,
}

/// `primary_addrs` / `backup_addrs`: number of addresses (peers) in each part. A part with
/// exactly one address gets a fake `down` peer in the other part. An upstream without primary
/// addresses is left alone, so nginx still reports it as having no servers.
pub fn plan(primary_addrs: usize, backup_addrs: usize) -> ExtendPlan {
    ExtendPlan {
        fake_backup: primary_addrs == 1,
        fake_primary: primary_addrs >= 1 && backup_addrs == 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_primary_gets_a_fake_backup() {
        assert_eq!(
            plan(1, 0),
            ExtendPlan {
                fake_backup: true,
                fake_primary: false
            }
        );
    }

    #[test]
    fn lone_backup_gets_a_fake_primary() {
        assert_eq!(
            plan(2, 1),
            ExtendPlan {
                fake_backup: false,
                fake_primary: true
            }
        );
        assert_eq!(
            plan(1, 1),
            ExtendPlan {
                fake_backup: true,
                fake_primary: true
            }
        );
    }

    #[test]
    fn larger_parts_are_untouched() {
        assert_eq!(plan(2, 0), ExtendPlan::default());
        assert_eq!(plan(3, 2), ExtendPlan::default());
        assert_eq!(plan(0, 0), ExtendPlan::default());
        assert_eq!(plan(0, 1), ExtendPlan::default());
    }
}
