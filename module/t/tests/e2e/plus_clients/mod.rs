//! The NGINX Plus API of the module (`upstreams_api plus`) driven by the field's own
//! clients, installed from Debian by `scripts/setup.sh test`: the Go client nginx-plus-go-client
//! 0.10.0 (through `module/t/plus-go`, built here against it), the official exporter
//! `prometheus-nginx-exporter` 0.11.0 with `-nginx.plus`, and schemathesis against our OpenAPI
//! description of the subset served (`docs/plus-api.openapi.yaml`). nginx runs with
//! `master_process on` and 2 workers (the live API tests' `Master`), on free loopback ports.
//!
//! A missing Debian tool skips a case with a loud message, except with `CI=true`, where it fails.

mod exporter;
mod go_client;
mod openapi;
mod tools;

use crate::case::Case;
use crate::live_api::{helpers, master};

/// The cases (each skips with a message when its Debian tool is missing, see above).
pub fn cases() -> Vec<Case> {
    vec![
        Case::ignorable_test(
            "go_client_reads_upstreams_and_stats",
            go_client::case_reads_upstreams_and_stats,
        ),
        Case::ignorable_test(
            "go_client_writes_are_followed_by_traffic_in_both_workers",
            go_client::case_writes_are_followed_by_traffic,
        ),
        Case::ignorable_test(
            "two_go_clients_updating_at_once_lose_no_server",
            go_client::case_two_writers_lose_no_server,
        ),
        Case::ignorable_test(
            "exporter_per_server_series_match_requests_sent",
            exporter::case_exporter_counts_match_requests,
        ),
        Case::ignorable_test(
            "schemathesis_plus_api_matches_its_openapi_description",
            openapi::case_schemathesis,
        ),
    ]
}
