//! A binding's live settings, `probe` and `drain_secs`: stored and read back by every
//! write path, and a store of before them (schema 3) is migrated at open with none set.
use std::collections::BTreeMap;

use tributary_store::{BindingRecord, SqliteFile, SCHEMA_VERSION};

fn binding(name: &str, probe: Option<&str>, drain_secs: u64) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "static".into(),
        provider: "static".into(),
        config: BTreeMap::new(),
        service: "api".into(),
        interval_secs: 60,
        directives: vec![],
        probe: probe.map(str::to_string),
        drain_secs,
    }
}

fn settings(s: &SqliteFile, name: &str) -> (Option<String>, u64) {
    let b = s.get_binding(name).unwrap().unwrap().binding;
    (b.probe, b.drain_secs)
}

#[test]
fn probe_and_drain_secs_are_stored_by_every_write_and_a_schema_3_store_is_migrated() {
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
                nginx_error TEXT, failure TEXT, applied TEXT, applied_reason TEXT);
             INSERT INTO bindings VALUES ('old', 'static', 'static', '{}', 'api', 60, '[]', 1, 1);
             PRAGMA user_version = 3;",
        )
        .unwrap();
    }
    let mut s = SqliteFile::open(&path).unwrap();
    assert_eq!(SCHEMA_VERSION, 5);
    assert_eq!(settings(&s, "old"), (None, 0), "none set before");

    let probe = "uri=/healthz interval=1s fails=2";
    s.insert_binding(&binding("a", Some(probe), 30)).unwrap();
    assert_eq!(settings(&s, "a"), (Some(probe.into()), 30));
    s.update_binding(&binding("a", None, 0)).unwrap();
    assert_eq!(settings(&s, "a"), (None, 0));
    s.upsert_bindings(&[binding("old", Some("type=tcp"), 5), binding("b", None, 7)])
        .unwrap();
    assert_eq!(settings(&s, "old"), (Some("type=tcp".into()), 5));
    assert_eq!(settings(&s, "b"), (None, 7));
    drop(s);
    let s = SqliteFile::open(&path).unwrap();
    assert_eq!(
        settings(&s, "old"),
        (Some("type=tcp".into()), 5),
        "after reopening"
    );

    // The record's JSON (the etcd mirror's and the API's shape) leaves unset settings out and
    // reads a value written before them.
    let old: BindingRecord = serde_json::from_value(serde_json::json!({"name": "x",
        "plugin": "p", "provider": "q", "config": {}, "service": "s", "interval_secs": 60,
        "directives": []}))
    .unwrap();
    assert_eq!((old.probe, old.drain_secs), (None, 0));
    let text = serde_json::to_string(&binding("x", None, 0)).unwrap();
    assert!(
        !text.contains("probe") && !text.contains("drain_secs"),
        "{text}"
    );
}
