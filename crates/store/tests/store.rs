use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use tributary_store::{
    BindingRecord, DroppedRecord, OutcomeRecord, OutcomeStatus, Store, StoreError, StoreOptions,
    Upsert,
};

fn binding(name: &str, targets: &str) -> BindingRecord {
    let mut config = BTreeMap::new();
    config.insert("targets".to_string(), serde_json::json!(targets));
    config.insert("token".to_string(), serde_json::json!("s3cr3t-value"));
    BindingRecord {
        name: name.to_string(),
        plugin: "static".into(),
        provider: "static".into(),
        config,
        service: "api".into(),
        interval_secs: 60,
        directives: vec!["keepalive 32;".into()],
    }
}

fn outcome(at: i64, status: OutcomeStatus) -> OutcomeRecord {
    OutcomeRecord {
        at_ms: at,
        duration_ms: 12,
        status,
        why: (status == OutcomeStatus::Failed).then(|| "plugin error".to_string()),
        code: (status == OutcomeStatus::Failed).then_some(-32003),
        field: (status == OutcomeStatus::Failed).then(|| "token".to_string()),
        kept: vec![serde_json::json!({"address": "127.0.0.1", "port": 8080, "weight": 1})],
        dropped: vec![DroppedRecord {
            target: serde_json::json!({"address": "10.0.0.1:80", "port": 80}),
            reason: "bad address".into(),
        }],
        ttl_seconds: Some(30),
        changed: status == OutcomeStatus::Ok,
        reloaded: status == OutcomeStatus::Ok,
        nginx_error: None,
    }
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn round_trip_survives_reopen_and_file_is_0600() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data").join("tributary.db");
    {
        let mut s = Store::open(&path).unwrap();
        s.insert_binding(&binding("api", "127.0.0.1:8080")).unwrap();
        s.insert_binding(&binding("web", "127.0.0.1:8081:5"))
            .unwrap();
        s.record_outcome("api", &outcome(1000, OutcomeStatus::Ok))
            .unwrap();
    }
    assert_eq!(mode(&path), 0o600, "database file mode");
    for suffix in ["-wal", "-shm"] {
        let side = path.with_file_name(format!("tributary.db{suffix}"));
        if side.exists() {
            assert_eq!(mode(&side), 0o600, "{suffix} mode");
        }
    }
    let s = Store::open(&path).unwrap();
    let list = s.list_bindings().unwrap();
    assert_eq!(
        list.iter()
            .map(|b| b.binding.name.as_str())
            .collect::<Vec<_>>(),
        ["api", "web"]
    );
    assert_eq!(list[0].binding, binding("api", "127.0.0.1:8080"));
    let got = s.get_binding("web").unwrap().unwrap();
    assert_eq!(got.binding, binding("web", "127.0.0.1:8081:5"));
    assert!(s.get_binding("nope").unwrap().is_none());
    let outcomes = s.recent_outcomes("api", 10).unwrap();
    assert_eq!(outcomes, vec![outcome(1000, OutcomeStatus::Ok)]);
}

#[test]
fn existing_file_with_wide_mode_is_tightened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _s = Store::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn duplicate_and_missing_names_are_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("t.db")).unwrap();
    s.insert_binding(&binding("api", "127.0.0.1:1")).unwrap();
    let err = s
        .insert_binding(&binding("api", "127.0.0.1:2"))
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate(ref n) if n == "api"),
        "{err}"
    );
    assert!(err.to_string().contains("already exists"));
    assert_eq!(
        s.get_binding("api").unwrap().unwrap().binding,
        binding("api", "127.0.0.1:1")
    );
    let err = s.update_binding(&binding("ghost", "x")).unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
    assert_eq!(s.list_bindings().unwrap().len(), 1);
}

#[test]
fn binding_names_are_unique_regardless_of_case() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("t.db")).unwrap();
    s.insert_binding(&binding("api", "127.0.0.1:1")).unwrap();
    let err = s
        .insert_binding(&binding("API", "127.0.0.1:2"))
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate(ref n) if n == "API"),
        "{err}"
    );
    let err = s
        .upsert_bindings(&[
            binding("other", "127.0.0.1:3"),
            binding("Api", "127.0.0.1:2"),
        ])
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate(ref n) if n == "Api"),
        "{err}"
    );
    // Nothing of the refused transaction was kept.
    let names: Vec<String> = s
        .list_bindings()
        .unwrap()
        .into_iter()
        .map(|b| b.binding.name)
        .collect();
    assert_eq!(names, ["api"]);
}

#[test]
fn a_store_holding_names_that_differ_in_case_still_opens() {
    // Written before the rule: the index cannot be built; the store opens and works.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(Store::open(&path).unwrap());
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("DROP INDEX bindings_name_nocase").unwrap();
    }
    let mut s = Store::open(&path).unwrap();
    s.insert_binding(&binding("api", "127.0.0.1:1")).unwrap();
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("DROP INDEX bindings_name_nocase").unwrap();
    }
    s.insert_binding(&binding("API", "127.0.0.1:2")).unwrap();
    drop(s);
    let s = Store::open(&path).unwrap();
    assert_eq!(s.list_bindings().unwrap().len(), 2);
}

#[test]
fn upsert_reports_created_updated_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("t.db")).unwrap();
    let r = s
        .upsert_bindings(&[binding("a", "127.0.0.1:1"), binding("b", "127.0.0.1:2")])
        .unwrap();
    assert_eq!(r, vec![Upsert::Created, Upsert::Created]);
    let r = s
        .upsert_bindings(&[binding("a", "127.0.0.1:1"), binding("b", "127.0.0.1:3")])
        .unwrap();
    assert_eq!(r, vec![Upsert::Unchanged, Upsert::Updated]);
    assert_eq!(
        s.get_binding("b").unwrap().unwrap().binding.config["targets"],
        "127.0.0.1:3"
    );
}

#[test]
fn history_is_trimmed_newest_first_and_removed_with_binding() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open_with(
        &dir.path().join("t.db"),
        StoreOptions {
            history_per_binding: 3,
        },
    )
    .unwrap();
    s.insert_binding(&binding("a", "x")).unwrap();
    s.insert_binding(&binding("b", "x")).unwrap();
    for i in 0..5 {
        let st = if i % 2 == 0 {
            OutcomeStatus::Unchanged
        } else {
            OutcomeStatus::Failed
        };
        s.record_outcomes(&[
            ("a".to_string(), outcome(i, st)),
            ("b".to_string(), outcome(100 + i, OutcomeStatus::Ok)),
        ])
        .unwrap();
    }
    let a = s.recent_outcomes("a", 10).unwrap();
    assert_eq!(a.iter().map(|o| o.at_ms).collect::<Vec<_>>(), [4, 3, 2]);
    assert_eq!(a[1].status, OutcomeStatus::Failed);
    assert_eq!(a[1].code, Some(-32003));
    assert_eq!(a[1].field.as_deref(), Some("token"));
    let last = s.last_outcomes().unwrap();
    assert_eq!(last["a"].at_ms, 4);
    assert_eq!(last["b"].at_ms, 104);

    assert!(s.remove_binding("a").unwrap());
    assert!(!s.remove_binding("a").unwrap());
    assert!(s.recent_outcomes("a", 10).unwrap().is_empty());
    // An outcome for a binding removed meanwhile is ignored, not an error.
    s.record_outcome("a", &outcome(9, OutcomeStatus::Ok))
        .unwrap();
    assert!(s.recent_outcomes("a", 10).unwrap().is_empty());
    assert_eq!(s.recent_outcomes("b", 10).unwrap().len(), 3);
}

#[test]
fn debug_never_prints_config_values() {
    let b = binding("api", "127.0.0.1:8080");
    let text = format!("{b:?}");
    assert!(text.contains("token"), "{text}");
    assert!(!text.contains("s3cr3t-value"), "{text}");
    assert!(!text.contains("127.0.0.1:8080"), "{text}");
}
