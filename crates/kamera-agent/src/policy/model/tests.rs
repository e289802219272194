//! The model policy's unit tests: validity, staleness, the check after each action.

use super::*;
use crate::policy::candidates::site_page;

/// What the old grammar allowed stays valid; what the page lacks is not.
#[test]
fn validity_is_the_schema() {
    let obs: Observation = serde_json::from_value(serde_json::json!({
        "url": "http://127.0.0.1/", "title": "t", "text": "",
        "elements": [
            {"id": 1, "tag": "button", "text": "Go", "x": 1.0, "y": 1.0},
            {"id": 2, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 1.0}
        ]
    }))
    .expect("observation");
    for a in [
        Action::Click { id: 1 },
        Action::Type {
            id: Some(2),
            text: "hi".into(),
        },
        Action::Key { key: "Enter".into() },
        Action::Scroll { dy: 300.0 },
        Action::Back,
        Action::Done { answer: "x".into() },
        Action::Drag { from: 1, to: 2 },
    ] {
        assert!(valid(&obs, &a), "{a:?}");
    }
    for a in [
        Action::Click { id: 3 },
        Action::Type {
            id: Some(1),
            text: "hi".into(),
        },
        Action::Check { id: 2 },
        Action::Navigate {
            url: "http://x/".into(),
        },
    ] {
        assert!(!valid(&obs, &a), "{a:?}");
    }
}

/// Actions already taken on an unchanged page are not offered again; text actions are.
#[test]
fn actions_that_did_nothing_are_not_repeated() {
    let mut p = ModelPolicy::with_retries(0);
    let obs = form("");
    p.seen(&obs);
    p.taken(&Action::Scroll { dy: 300.0 }, &obs);
    p.seen(&obs);
    p.taken(&Action::Click { id: 2 }, &obs);
    p.seen(&obs);
    assert!(p.stale(&Action::Scroll { dy: 300.0 }));
    assert!(p.stale(&Action::Click { id: 2 }));
    assert!(!p.stale(&Action::Click { id: 3 }));
    p.taken(&Action::Done { answer: "x".into() }, &obs);
    assert!(!p.stale(&Action::Done { answer: "x".into() }));
}

/// An action taken on a page stays stale at a later visit of the same page (it would go
/// round the same loop); on another page it is offered.
#[test]
fn an_action_is_not_repeated_at_a_revisit() {
    let mut p = ModelPolicy::default();
    let (list, other) = (form(""), form("x"));
    p.seen(&list);
    p.taken(&Action::Click { id: 2 }, &list);
    p.seen(&other);
    p.taken(&Action::Key { key: "Enter".into() }, &other);
    p.seen(&other);
    assert!(!p.stale(&Action::Click { id: 2 }), "not taken on this page");
    p.taken(&Action::Scroll { dy: 300.0 }, &other);
    p.seen(&list);
    assert!(
        p.stale(&Action::Click { id: 2 }),
        "taken at the first visit of this page"
    );
}

/// A page whose text changes only in a countdown line (MiniWoB++'s timer) is the same page:
/// a click that did nothing stays stale. A changed element makes it a new page.
#[test]
fn a_ticking_timer_does_not_make_a_new_page() {
    let page = |timer: u32, button: &str| -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/miniwob/click-test.html", "title": "t",
            "text": format!("Click the button.\n[1] button \"{button}\"\nTime left: {timer} / 10sec"),
            "elements": [
                {"id": 1, "tag": "button", "text": button, "x": 5.0, "y": 5.0},
                {"id": 2, "tag": "div", "text": format!("Time left: {timer} / 10sec"),
                 "interactive": false, "x": 5.0, "y": 90.0}
            ]
        }))
        .expect("observation")
    };
    let mut p = ModelPolicy::default();
    p.seen(&page(9, "Go"));
    p.taken(&Action::Click { id: 1 }, &page(9, "Go"));
    // Another action after it, so that the click is not also the last action.
    p.taken(&Action::Scroll { dy: 300.0 }, &page(9, "Go"));
    p.seen(&page(8, "Go"));
    assert!(
        p.stale(&Action::Click { id: 1 }),
        "the timer ticked; the page did not change"
    );
    p.seen(&page(7, "Gone"));
    assert!(!p.stale(&Action::Click { id: 1 }), "the button changed: a new page");
}

fn form(user: &str) -> Observation {
    serde_json::from_value(serde_json::json!({
        "url": "http://127.0.0.1/miniwob/login-user.html", "title": "Login",
        "text": format!("Username\n[1] input type=text \"{user}\"\n[2] button \"Login\""),
        "elements": [
            {"id": 1, "tag": "input", "text": user, "editable": true, "x": 1.0, "y": 1.0},
            {"id": 2, "tag": "button", "text": "Login", "x": 1.0, "y": 2.0}
        ]
    }))
    .expect("observation")
}

/// The check after each action: the next prompt says what was done and whether it changed
/// the page; a field that took its text is not typed into again; the last action is not
/// offered right after itself, even when it changed the page.
#[test]
fn each_prompt_says_what_was_done_and_what_it_did() {
    let mut p = ModelPolicy::new(Decoding::Ranked);
    let empty = form("");
    p.seen(&empty);
    assert!(p.prompt(&empty, "g").contains("Now this task.\nCurrent page: Login (http://127.0.0.1/miniwob/login-user.html).\nGoal: g\nDone so far: nothing\n"));
    let typed = Action::Type {
        id: Some(1),
        text: "keli".into(),
    };
    p.taken(&typed, &empty);
    let filled = form("keli");
    p.seen(&filled);
    assert!(
        p.prompt(&filled, "g")
            .contains("Done so far:\n- type \"keli\" into text field near \"Username\" [1] (the page changed)\n"),
        "{}",
        p.prompt(&filled, "g")
    );
    assert!(p.fills_again(&typed, &filled), "the field holds what was typed");
    assert!(!p.fills_again(&typed, &empty));
    p.taken(&Action::Click { id: 2 }, &filled);
    let after = form("keli!");
    p.seen(&after);
    assert!(p.stale(&Action::Click { id: 2 }), "the last action, right after itself");
    assert!(
        p.prompt(&after, "g")
            .contains("click button \"Login\" [2] (the page changed)")
    );
    p.taken(&Action::Key { key: "Enter".into() }, &after);
    p.seen(&after);
    assert!(p.prompt(&after, "g").contains("- press Enter (nothing changed)\n"));
    assert!(
        !p.stale(&Action::Click { id: 2 }),
        "no longer the last action, on a changed page"
    );
}

/// On a page reached from another URL, the menu carried over from it is not offered where the
/// page has an action of its own; on a page with none of its own it is. A field this episode
/// filled is not clicked again.
#[test]
fn a_new_page_offers_its_own_actions_before_the_menu() {
    let next = |s: &str| format!("{} {s}", example::NEXT);
    let mut p = ModelPolicy::new(Decoding::Constrained);
    let list = site_page("http://s/orders", &[("View A-1", "/orders/A-1")]);
    p.seen(&list);
    let w = p.words(&list);
    assert!(
        w.action(&next("click link \"Home\" [1]")).is_some(),
        "the first page: nothing carried over"
    );
    assert!(
        w.action(&next("click link \"Orders\" [2]")).is_none(),
        "a link to this page"
    );
    p.taken(&Action::Click { id: 3 }, &list);
    let order = site_page("http://s/orders/A-1", &[("Track this shipment", "/shipping")]);
    p.seen(&order);
    let w = p.words(&order);
    assert_eq!(
        w.action(&next("click link \"Track this shipment\" [3]")),
        Some(Action::Click { id: 3 })
    );
    assert_eq!(
        w.action(&next("click link \"Orders\" [2]")),
        None,
        "the menu, carried over"
    );
    p.taken(&Action::Click { id: 3 }, &order);
    let status = site_page("http://s/shipping/T-1", &[]);
    p.seen(&status);
    assert_eq!(
        p.words(&status).action(&next("click link \"Orders\" [2]")),
        Some(Action::Click { id: 2 }),
        "nothing of its own: the menu is offered"
    );

    let mut p = ModelPolicy::new(Decoding::Constrained);
    let empty = form("");
    p.seen(&empty);
    p.taken(
        &Action::Type {
            id: Some(1),
            text: "keli".into(),
        },
        &empty,
    );
    let filled = form("keli");
    p.seen(&filled);
    assert!(
        p.fills_again(&Action::Click { id: 1 }, &filled),
        "a click into the filled field"
    );
    assert_eq!(p.words(&filled).action(&next("click text field \"keli\" [1]")), None);
}
