//! Display tags of kept targets. Validation (`tributary_core::validate`) keeps address, port and
//! weight only — nothing else reaches the generated file. For display (API, UI), each kept target
//! gets back the `tags` its plugin gave it (`targets[].tags`: labels for display), bounded in count
//! and length.

use std::collections::HashMap;

use serde_json::Value;
use tributary_core::{validate, Target};

/// Most tags shown per target.
pub const MAX_TAGS: usize = 16;
/// Longest tag shown, in characters.
pub const MAX_TAG_LEN: usize = 64;

/// The kept targets as JSON objects (`address`, `port`, `weight`, and `tags` when the plugin gave
/// some for that server).
pub fn kept_with_tags(kept: &[Target], raw: &[Value]) -> Vec<Value> {
    let mut tags: HashMap<Target, Vec<String>> = HashMap::new();
    for r in raw {
        let Some(list) = r.get("tags").and_then(Value::as_array) else {
            continue;
        };
        let Some(target) = validate(std::slice::from_ref(r)).targets.into_iter().next() else {
            continue;
        };
        let entry = tags.entry(target).or_default();
        for t in list.iter().filter_map(Value::as_str) {
            if entry.len() >= MAX_TAGS {
                break;
            }
            let t: String = t
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_TAG_LEN)
                .collect();
            if !t.is_empty() && !entry.contains(&t) {
                entry.push(t);
            }
        }
    }
    kept.iter()
        .map(|t| {
            let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
            if let (Some(list), Some(obj)) = (tags.get(t), v.as_object_mut()) {
                if !list.is_empty() {
                    obj.insert("tags".into(), Value::from(list.clone()));
                }
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tags_follow_their_server_and_are_bounded() {
        let raw = vec![
            json!({"address": "10.0.1.12", "port": 8080, "weight": 1, "tags": ["zone-a"]}),
            json!({"address": "10.0.2.7", "port": 8080, "weight": 2, "tags": ["zone-b", "canary", "zone-b", 5]}),
            json!({"address": "2001:db8::17", "port": 8443}),
            json!({"address": "bad host", "port": 1, "tags": ["x"]}),
            json!({"address": "10.0.3.1", "port": 80, "tags": (0..40).map(|i| format!("t{i}\n{}", "x".repeat(100))).collect::<Vec<_>>()}),
        ];
        let v = validate(&raw);
        let shown = kept_with_tags(&v.targets, &raw);
        assert_eq!(shown.len(), 4);
        let by_addr = |a: &str| shown.iter().find(|s| s["address"] == a).unwrap().clone();
        assert_eq!(by_addr("10.0.1.12")["tags"], json!(["zone-a"]));
        assert_eq!(by_addr("10.0.2.7")["tags"], json!(["zone-b", "canary"]));
        assert!(by_addr("2001:db8::17").get("tags").is_none());
        let many = by_addr("10.0.3.1")["tags"].as_array().unwrap().clone();
        assert_eq!(many.len(), MAX_TAGS);
        assert!(many.iter().all(|t| {
            let t = t.as_str().unwrap();
            t.chars().count() <= MAX_TAG_LEN && !t.contains('\n')
        }));
    }
}
