//! The canonical bytes of log entries (RFC 8785 JSON).

use proptest::prelude::*;
use redrive_tlog::leaf::{ActionLeaf, Entry, EventLeaf, LeafError, check_at};
use redrive_tlog::merkle;

fn event() -> Entry {
    Entry::Event(EventLeaf {
        plan_id: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
        id: 17,
        at: "2025-01-02T03:04:05.678901Z".into(),
        slice_id: Some(3),
        dead_letter_id: 42,
        message_key: "order-1".into(),
        message_id: "m-1".into(),
        destination: "orders.retry".into(),
        action: "replayed".into(),
        reason: "line1\n\"quoted\" \\ tab\t \u{1} \u{7f} é €".into(),
        wave: "canary".into(),
        executor_id: "exec-a".into(),
        attempt: 1,
        confirm_latency_us: -1234,
    })
}

fn action() -> Entry {
    Entry::Action(ActionLeaf {
        plan_id: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
        id: 5,
        at: "2025-01-02T03:04:05.000000Z".into(),
        action: "approve".into(),
        actor: "alice@example.com".into(),
        reason: "=SUM(A1)".into(),
    })
}

const EVENT_BYTES: &str = r#"{"action":"replayed","at":"2025-01-02T03:04:05.678901Z","attempt":1,"confirm_latency_us":-1234,"dead_letter_id":42,"destination":"orders.retry","executor_id":"exec-a","id":17,"kind":"event","message_id":"m-1","message_key":"order-1","plan_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","reason":"line1\n\"quoted\" \\ tab\t \u0001 <DEL> é €","slice_id":3,"wave":"canary"}"#;

const ACTION_BYTES: &str = r#"{"action":"approve","actor":"alice@example.com","at":"2025-01-02T03:04:05.000000Z","id":5,"kind":"action","plan_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","reason":"=SUM(A1)"}"#;

#[test]
fn event_bytes_are_sorted_jcs() {
    // The DEL character (U+007F) is not escaped by JCS (nor by serde_json):
    // the bytes have it raw, where the literal says <DEL>.
    let expected = EVENT_BYTES.replace("<DEL>", "\u{7f}");
    assert_eq!(
        String::from_utf8(event().canonical_bytes()).unwrap(),
        expected
    );
}

#[test]
fn action_bytes_are_sorted_jcs() {
    assert_eq!(
        String::from_utf8(action().canonical_bytes()).unwrap(),
        ACTION_BYTES
    );
}

#[test]
fn no_slice_is_null() {
    let Entry::Event(mut leaf) = event() else {
        unreachable!()
    };
    leaf.slice_id = None;
    let bytes = String::from_utf8(Entry::Event(leaf).canonical_bytes()).unwrap();
    assert!(
        bytes.contains(r#""reason":"#) && bytes.contains(r#","slice_id":null,"wave":"canary"}"#)
    );
}

#[test]
fn round_trip() {
    for entry in [event(), action()] {
        let bytes = entry.canonical_bytes();
        assert_eq!(Entry::from_canonical(&bytes).unwrap(), entry);
        assert_eq!(entry.leaf_hash(), merkle::leaf_hash(&bytes));
    }
    let Entry::Event(mut leaf) = event() else {
        unreachable!()
    };
    leaf.slice_id = None;
    let entry = Entry::Event(leaf);
    assert_eq!(
        Entry::from_canonical(&entry.canonical_bytes()).unwrap(),
        entry
    );
}

#[test]
fn accessors() {
    assert_eq!(event().kind(), "event");
    assert_eq!(action().kind(), "action");
    assert_eq!(event().id(), 17);
    assert_eq!(action().plan_id(), "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
}

#[test]
fn from_canonical_is_strict() {
    let action = ACTION_BYTES;
    let not_canonical = [
        // Keys out of order.
        action.replace(
            r#""action":"approve","actor":"alice@example.com""#,
            r#""actor":"alice@example.com","action":"approve""#,
        ),
        // Whitespace.
        action.replace(r#""id":5"#, r#""id": 5"#),
        format!("{action}\n"),
        format!(" {action}"),
        // Escapes JCS does not use.
        action.replace("approve", r"appro\u0076e"),
        action.replace("alice@example.com", r"alice\/example.com"),
        // A number not written as JCS writes it.
        action.replace(r#""id":5"#, r#""id":5.0"#),
        action.replace(r#""id":5"#, r#""id":05"#),
        // A repeated key.
        action.replace(r#""id":5,"#, r#""id":5,"id":5,"#),
    ];
    for bytes in &not_canonical {
        assert!(
            Entry::from_canonical(bytes.as_bytes()).is_err(),
            "{bytes} accepted"
        );
    }
    assert!(matches!(
        Entry::from_canonical(action.replace(r#""id":5"#, r#""id": 5"#).as_bytes()),
        Err(LeafError::NotCanonical)
    ));
    let errors = [
        (
            action.replace(r#""kind":"action","#, ""),
            "`kind` is missing",
        ),
        (
            action.replace(r#""kind":"action""#, r#""kind":"other""#),
            "\"other\"",
        ),
        (
            action.replace(r#""id":5,"#, r#""id":5,"extra":1,"#),
            "`extra` is not a field",
        ),
        (action.replace(r#""id":5"#, r#""id":"5""#), "`id` is not"),
        (
            action.replace(r#""actor":"alice@example.com","#, ""),
            "`actor` is missing",
        ),
        (
            action.replace("2025-01-02T03:04:05.000000Z", "2025-01-02T03:04:05Z"),
            "not RFC 3339",
        ),
        ("[1]".to_owned(), "not a JSON object"),
        ("{".to_owned(), "not JSON"),
    ];
    for (bytes, expected) in errors {
        let error = Entry::from_canonical(bytes.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{bytes}: {error}");
    }
    // An attempt beyond 32 bits.
    let big = EVENT_BYTES
        .replace("<DEL>", "\u{7f}")
        .replace(r#""attempt":1"#, r#""attempt":4294967296"#);
    assert!(Entry::from_canonical(big.as_bytes()).is_err());
}

#[test]
fn times_are_checked() {
    for good in [
        "2025-01-02T03:04:05.678901Z",
        "2024-02-29T23:59:59.999999Z",
        "2016-12-31T23:59:60.000000Z",
    ] {
        assert!(check_at(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "2025-01-02T03:04:05.678Z",
        "2025-01-02T03:04:05.678901+00:00",
        "2025-01-02 03:04:05.678901Z",
        "2025-01-02t03:04:05.678901z",
        "2025-13-02T03:04:05.678901Z",
        "2025-02-29T03:04:05.678901Z",
        "2025-04-31T03:04:05.678901Z",
        "2025-01-00T03:04:05.678901Z",
        "2025-01-02T24:04:05.678901Z",
        "2025-01-02T03:60:05.678901Z",
        "2025-01-02T03:04:61.678901Z",
        "2025-01-02T03:04:05.6789012Z",
        "２025-01-02T03:04:05.678901Z",
    ] {
        assert!(check_at(bad).is_err(), "{bad}");
    }
}

proptest! {
    /// Any strings survive the round trip, and the bytes are valid JSON
    /// whose keys come out sorted.
    #[test]
    fn any_strings_round_trip(
        texts in prop::collection::vec(any::<String>(), 8),
        numbers in any::<(i64, i64, i64, i32, i64, Option<i64>)>(),
    ) {
        let entry = Entry::Event(EventLeaf {
            plan_id: texts[0].clone(),
            id: numbers.0,
            at: "2025-01-02T03:04:05.678901Z".into(),
            slice_id: numbers.5,
            dead_letter_id: numbers.1,
            message_key: texts[1].clone(),
            message_id: texts[2].clone(),
            destination: texts[3].clone(),
            action: texts[4].clone(),
            reason: texts[5].clone(),
            wave: texts[6].clone(),
            executor_id: texts[7].clone(),
            attempt: numbers.3,
            confirm_latency_us: numbers.4,
        });
        let bytes = entry.canonical_bytes();
        prop_assert_eq!(Entry::from_canonical(&bytes).unwrap(), entry.clone());
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(value.as_object().unwrap().len(), 15);
        let action = Entry::Action(ActionLeaf {
            plan_id: texts[0].clone(),
            id: numbers.2,
            at: "2025-01-02T03:04:05.678901Z".into(),
            action: texts[1].clone(),
            actor: texts[2].clone(),
            reason: texts[3].clone(),
        });
        prop_assert_eq!(Entry::from_canonical(&action.canonical_bytes()).unwrap(), action);
    }
}
