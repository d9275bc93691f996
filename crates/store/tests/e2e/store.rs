use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use tributary_store::{
    Applied, BindingRecord, DroppedRecord, Failure, OutcomeRecord, OutcomeStatus, ReloadReason,
    SqliteFile, StoreError, StoreOptions, Upsert, SCHEMA_VERSION,
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
        drain_secs: 0,
        probe: None,
    }
}

fn outcome(at: i64, status: OutcomeStatus) -> OutcomeRecord {
    OutcomeRecord {
        at_ms: at,
        duration_ms: 12,
        status,
        failure: (status == OutcomeStatus::Failed).then_some(Failure::PluginError),
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
        applied: None,
        applied_reason: None,
        reload_reason: None,
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
        let mut s = SqliteFile::open(&path).unwrap();
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
    let s = SqliteFile::open(&path).unwrap();
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
    let _s = SqliteFile::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn duplicate_and_missing_names_are_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = SqliteFile::open(&dir.path().join("t.db")).unwrap();
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
    let mut s = SqliteFile::open(&dir.path().join("t.db")).unwrap();
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
    drop(SqliteFile::open(&path).unwrap());
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("DROP INDEX bindings_name_nocase").unwrap();
    }
    let mut s = SqliteFile::open(&path).unwrap();
    s.insert_binding(&binding("api", "127.0.0.1:1")).unwrap();
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("DROP INDEX bindings_name_nocase").unwrap();
    }
    s.insert_binding(&binding("API", "127.0.0.1:2")).unwrap();
    drop(s);
    let s = SqliteFile::open(&path).unwrap();
    assert_eq!(s.list_bindings().unwrap().len(), 2);
}

#[test]
fn upsert_reports_created_updated_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = SqliteFile::open(&dir.path().join("t.db")).unwrap();
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
    let mut s = SqliteFile::open_with(
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

#[test]
fn failure_kind_is_stored_as_a_tag_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut s = SqliteFile::open(&path).unwrap();
    s.insert_binding(&binding("api", "127.0.0.1:8080")).unwrap();
    let mut written = Vec::new();
    for (i, kind) in Failure::ALL.into_iter().enumerate() {
        let mut o = outcome(i as i64, OutcomeStatus::Failed);
        o.failure = Some(kind);
        s.record_outcome("api", &o).unwrap();
        written.push(o);
    }
    let mut ok = outcome(100, OutcomeStatus::Ok);
    ok.failure = None;
    s.record_outcome("api", &ok).unwrap();
    written.push(ok);
    drop(s);

    // The column holds the tag itself, not prose.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let tags: Vec<Option<String>> = conn
        .prepare("SELECT failure FROM outcomes ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut expected: Vec<Option<String>> = Failure::ALL
        .iter()
        .map(|f| Some(f.as_str().to_string()))
        .collect();
    expected.push(None);
    assert_eq!(tags, expected);
    for f in Failure::ALL {
        assert_eq!(Failure::parse(f.as_str()), Some(f));
        assert_eq!(
            serde_json::to_value(f).unwrap(),
            serde_json::json!(f.as_str())
        );
    }
    drop(conn);

    let s = SqliteFile::open(&path).unwrap();
    let mut back = s.recent_outcomes("api", 100).unwrap();
    back.reverse();
    assert_eq!(back, written);
}

#[test]
fn unknown_failure_tag_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut s = SqliteFile::open(&path).unwrap();
    s.insert_binding(&binding("api", "127.0.0.1:8080")).unwrap();
    s.record_outcome("api", &outcome(1, OutcomeStatus::Failed))
        .unwrap();
    drop(s);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE outcomes SET failure = 'exploded'", [])
        .unwrap();
    drop(conn);
    let s = SqliteFile::open(&path).unwrap();
    let err = s.recent_outcomes("api", 10).unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::Corrupt {
                what: "failure kind",
                ..
            }
        ),
        "{err}"
    );
}

/// A store written by the previous version (schema 1, no `failure` column) is migrated at open:
/// the column is added and earlier failures get their kind from the words written then.
#[test]
fn schema_1_store_is_migrated_with_failure_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE bindings (name TEXT PRIMARY KEY NOT NULL, plugin TEXT NOT NULL,
                provider TEXT NOT NULL, config TEXT NOT NULL, service TEXT NOT NULL,
                interval_secs INTEGER NOT NULL, directives TEXT NOT NULL,
                created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
             CREATE TABLE outcomes (id INTEGER PRIMARY KEY AUTOINCREMENT,
                binding TEXT NOT NULL REFERENCES bindings(name) ON DELETE CASCADE,
                at_ms INTEGER NOT NULL, duration_ms INTEGER NOT NULL, status TEXT NOT NULL,
                why TEXT, code INTEGER, field TEXT, kept TEXT NOT NULL, dropped TEXT NOT NULL,
                ttl_seconds INTEGER, changed INTEGER NOT NULL, reloaded INTEGER NOT NULL,
                nginx_error TEXT);
             CREATE INDEX outcomes_by_binding ON outcomes(binding, id);
             INSERT INTO bindings VALUES ('api', 'static', 'static', '{}', 'api', 60, '[]', 1, 1);
             PRAGMA user_version = 1;",
        )
        .unwrap();
        let rows: [(&str, Option<&str>, Option<i64>); 10] = [
            ("ok", None, None),
            ("unchanged", None, None),
            (
                "failed",
                Some("plugin \"consul\": bad token; the current servers were kept"),
                Some(-32003),
            ),
            (
                "failed",
                Some("plugin \"consul\": timed out after 30 s; the current servers were kept"),
                None,
            ),
            (
                "failed",
                Some("no valid target (2 dropped: bad port); the current file was kept"),
                None,
            ),
            (
                "failed",
                Some("the service has no servers right now; the current file was kept"),
                None,
            ),
            (
                "failed",
                Some("nginx -t failed with the new file; the previous file was restored"),
                None,
            ),
            (
                "failed",
                Some("nginx reload failed; the previous file was restored"),
                None,
            ),
            (
                "failed",
                Some("the file could not be written (No space left on device); nothing changed"),
                None,
            ),
            (
                "failed",
                Some("the daemon is stopping; nothing applied"),
                None,
            ),
        ];
        for (i, (status, why, code)) in rows.iter().enumerate() {
            conn.execute(
                "INSERT INTO outcomes (binding, at_ms, duration_ms, status, why, code, kept, \
                 dropped, changed, reloaded) VALUES ('api', ?1, 1, ?2, ?3, ?4, '[]', '[]', 0, 0)",
                rusqlite::params![i as i64, status, why, code],
            )
            .unwrap();
        }
    }
    let s = SqliteFile::open_with(
        &path,
        StoreOptions {
            history_per_binding: 100,
        },
    )
    .unwrap();
    let mut got: Vec<Option<Failure>> = s
        .recent_outcomes("api", 100)
        .unwrap()
        .into_iter()
        .map(|o| o.failure)
        .collect();
    got.reverse();
    assert_eq!(
        got,
        vec![
            None,
            None,
            Some(Failure::PluginError),
            Some(Failure::PluginNoAnswer),
            Some(Failure::NoValidTarget),
            Some(Failure::NoValidTarget),
            Some(Failure::TestFailed),
            Some(Failure::ReloadFailed),
            Some(Failure::WriteFailed),
            Some(Failure::Stopping),
        ]
    );
    drop(s);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    // Opening again does not run the migration twice.
    drop(conn);
    SqliteFile::open(&path).unwrap();
}

/// The applied path and its reason round-trip; a schema-2 file gets `reload` for the outcomes
/// that reloaded nginx (every applied change was a reload before live mode existed).
#[test]
fn applied_path_round_trips_and_schema_2_reloads_become_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let mut s = SqliteFile::open(&path).unwrap();
        s.insert_binding(&binding("api", "127.0.0.1:8080")).unwrap();
        let mut live = outcome(1, OutcomeStatus::Ok);
        live.reloaded = false;
        live.applied = Some(Applied::Live);
        live.applied_reason = Some("servers changed; live API confirmed".into());
        let mut reload = outcome(2, OutcomeStatus::Ok);
        reload.applied = Some(Applied::Reload);
        reload.applied_reason = Some("new upstream".into());
        reload.reload_reason = Some(ReloadReason::NewUpstream);
        s.record_outcome("api", &live).unwrap();
        s.record_outcome("api", &reload).unwrap();
        let got = s.recent_outcomes("api", 10).unwrap();
        assert_eq!(got, vec![reload, live]);
        // Make it look like a schema-2 file written before the columns existed.
        drop(s);
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "UPDATE outcomes SET applied = NULL, applied_reason = NULL;
             ALTER TABLE outcomes DROP COLUMN reload_reason;
             ALTER TABLE outcomes DROP COLUMN applied_reason;
             ALTER TABLE outcomes DROP COLUMN applied;
             ALTER TABLE bindings DROP COLUMN drain_secs;
             ALTER TABLE bindings DROP COLUMN probe;
             PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    let s = SqliteFile::open(&path).unwrap();
    let got: Vec<Option<Applied>> = s
        .recent_outcomes("api", 10)
        .unwrap()
        .into_iter()
        .map(|o| o.applied)
        .collect();
    assert_eq!(
        got,
        vec![Some(Applied::Reload), None],
        "reloaded=1 → reload"
    );
}
