//! The action cache's unit tests: an entry stored, hit, healed and marked stale; pages sharing a
//! URL and a task kept apart; bad files named.

use super::*;

fn obs(url: &str, title: &str, elements: serde_json::Value) -> Observation {
    serde_json::from_value(serde_json::json!({"url": url, "title": title, "text": "", "elements": elements}))
        .expect("observation")
}

/// Stored, then a hit on the same page, healed on a renamed one, and a step that led
/// elsewhere is marked stale (the next use decides afresh).
#[test]
fn store_hit_heal_and_stale() {
    let dir = tempfile::tempdir().unwrap();
    let o = "http://127.0.0.1:1";
    let home = obs(
        &format!("{o}/"),
        "Home",
        serde_json::json!([
        {"id": 1, "tag": "a", "text": "Orders", "href": format!("{o}/orders"), "x": 1.0, "y": 1.0}]),
    );
    let orders = obs(&format!("{o}/orders"), "Orders", serde_json::json!([]));
    let mut c = ActionCache::open(dir.path()).unwrap();
    assert_eq!(
        c.target("click text:Orders", &home, o).unwrap().0,
        Use::Decide { healing: false }
    );
    c.record_target("click text:Orders", &home, o, 1, false);
    assert!(!c.observed(&orders, o).unwrap());
    let mut c = ActionCache::open(dir.path()).unwrap();
    assert_eq!(c.target("click text:Orders", &home, o).unwrap().0, Use::Hit);
    assert!(!c.observed(&orders, o).unwrap());
    let renamed = obs(
        "http://127.0.0.1:2/",
        "Home",
        serde_json::json!([
        {"id": 7, "tag": "a", "text": "Purchases", "href": "http://127.0.0.1:2/orders", "x": 9.0, "y": 1.0}]),
    );
    let (u, id, _) = c.target("click text:Orders", &renamed, "http://127.0.0.1:2").unwrap();
    assert_eq!((u, id), (Use::Healed, Some(7)));
    // It did nothing: stale, retried once.
    assert!(c.observed(&renamed, "http://127.0.0.1:2").unwrap());
    assert_eq!(
        c.target("click text:Orders", &renamed, "http://127.0.0.1:2").unwrap().0,
        Use::Decide { healing: true }
    );
    assert_eq!(
        c.stats(),
        &CacheStats {
            hits: 1,
            healed: 1,
            stored: 0,
            mismatches: 1
        }
    );
}

/// A corrupt file and a file of another version are errors naming them.
#[test]
fn bad_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("0123.json");
    std::fs::write(&f, b"{ not json").unwrap();
    let e = ActionCache::open(dir.path()).err().expect("corrupt").to_string();
    assert!(e.contains("0123.json") && e.contains("not JSON"), "{e}");
    std::fs::write(&f, br#"{"version": 99}"#).unwrap();
    let e = ActionCache::open(dir.path()).err().expect("version").to_string();
    assert!(e.contains("0123.json") && e.contains("version 99"), "{e}");
}

/// Two pages at one URL under one task (a task's seeds) keep an entry each: each replays its
/// own action, found on its own page, with no model call.
#[test]
fn pages_sharing_url_and_task_keep_their_own_entries() {
    let dir = tempfile::tempdir().unwrap();
    let o = "http://127.0.0.1:1";
    let widgets = |first: &str, second: &str| {
        obs(
            &format!("{o}/task.html"),
            "Task",
            serde_json::json!([
                {"id": 1, "tag": "button", "text": first, "interactive": true, "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "button", "text": second, "interactive": true, "x": 1.0, "y": 9.0}]),
        )
    };
    let (a, b) = (widgets("textarea", "slider"), widgets("spinner", "checkbox"));
    let task = "Click on a \"textarea\" widget.";
    let mut c = ActionCache::open(dir.path()).unwrap();
    // The second page finds the first one's entry under the structure-free key: not its
    // target, so it is decided afresh (healing), and kept under its own structure too.
    for (page, id, healing) in [(&a, 1, false), (&b, 2, true)] {
        c.visits.clear();
        assert_eq!(c.action(task, page, o).unwrap().0, Use::Decide { healing });
        c.record_action(task, page, o, &Action::Click { id }, healing);
        c.finish().unwrap();
    }
    for (page, id) in [(&a, 1), (&b, 2)] {
        let mut c = ActionCache::open(dir.path()).unwrap();
        assert_eq!(c.action(task, page, o).unwrap(), (Use::Hit, Some(Action::Click { id })));
    }
}
