//! The module's integration tests, one binary (`e2e`) with a module per area; every case is a
//! named test `AREA::NAME` (`case.rs`), run by `libtest_mimic` so `cargo nextest` lists and runs
//! each one; run directly the binary ends with `N passed, N failed`. Each case runs Debian's
//! nginx with the module loaded through `ngx_harness` (the test stack of `tributary-testkit`).
//!
//! Areas: `harness` (the runner's own guarantees), `upstream_directives` (`add_upstream`,
//! `combine_server_singlets`, `extend_single_peers`), `upstrand` and `upstrand_order`
//! (`upstrand`, its variables and `dynamic_upstrand`; shared set-up in `upstrand_common.rs`),
//! `regressions`, `reload` (reloads under load), `live_api` (the live upstreams API, master + 2
//! workers; its runner `live_api/master.rs`), `plus_clients` (the Plus-compatible API driven by
//! the field's own clients, which `scripts/setup.sh test` installs).

/// `Case::test` for each named function, named after it.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        vec![$(crate::case::Case::test(stringify!($case), $case)),*]
    };
}

mod case;
mod harness;
mod live_api;
mod plus_clients;
mod regressions;
mod reload;
mod upstrand;
mod upstrand_common;
mod upstrand_order;
mod upstream_directives;

use case::area;

fn main() {
    let mut trials = Vec::new();
    trials.extend(area("harness", harness::cases()));
    trials.extend(area("upstream_directives", upstream_directives::cases()));
    trials.extend(area("upstrand", upstrand::cases()));
    trials.extend(area("upstrand_order", upstrand_order::cases()));
    trials.extend(area("regressions", regressions::cases()));
    trials.extend(area("reload", reload::cases()));
    trials.extend(area("live_api", live_api::cases()));
    trials.extend(area("plus_clients", plus_clients::cases()));
    ngx_harness::run_tests(trials)
}
