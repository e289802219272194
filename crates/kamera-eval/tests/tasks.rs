//! The task format, its errors and the generator (no model needed).

use std::path::Path;

use kamera_eval::{Error, GenConfig, generate, load_tasks, parse_tasks, tasks_to_jsonl};

#[test]
fn generator_is_deterministic_and_the_default_suite_is_in_sync() {
    let cfg = GenConfig::default();
    let a = generate(&cfg);
    assert_eq!(a, generate(&cfg));
    assert!(a.len() >= 100);
    assert_ne!(a, generate(&GenConfig { seed: 8, ..cfg.clone() }));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks/default.jsonl");
    let committed = load_tasks(&path).unwrap();
    assert_eq!(
        committed, a,
        "tasks/default.jsonl is stale: run `cargo run --release -p kamera-eval --example gen_tasks`"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, tasks_to_jsonl(&a));
}

#[test]
fn generated_tasks_are_multi_hop_web_pages() {
    let tasks = generate(&GenConfig::default());
    let mut templates = std::collections::BTreeSet::new();
    for t in &tasks {
        t.validate().unwrap();
        templates.insert(t.id.split('-').next().unwrap().to_string());
        assert_eq!(t.chunks.len(), 3);
        let city = t.answer.trim().trim_end_matches('.');
        // The answer is on exactly one page, which does not name the question's subject: the
        // subject's page names the entity that the answer page is about.
        let with_answer: Vec<&String> = t.chunks.iter().filter(|c| c.contains(city)).collect();
        assert_eq!(with_answer.len(), 1, "{}", t.id);
        assert!(!t.question.contains(city));
        for c in &t.chunks {
            assert!(c.contains("=== Page: https://"), "{}", t.id);
            assert!(
                c.len() > 800,
                "pages of a few hundred tokens: {} has {} chars",
                t.id,
                c.len()
            );
        }
    }
    assert_eq!(templates.len(), 3, "{templates:?}");
    let short = generate(&GenConfig {
        filler: 0,
        tasks: 3,
        ..GenConfig::default()
    });
    assert!(short.iter().all(|t| t.chunks.iter().all(|c| c.len() < 400)));
}

#[test]
fn bad_task_files_give_clear_errors() {
    let p = Path::new("bad.jsonl");
    let cases = [
        ("{not json", "line 1"),
        (r#"{"id": "a", "chunks": ["x"], "question": "q"}"#, "answer"),
        (
            r#"{"id": "a", "chunks": [], "question": "q", "answer": "b"}"#,
            "no chunks",
        ),
        (
            r#"{"id": "a", "chunks": ["x", " "], "question": "q", "answer": "b"}"#,
            "chunk 1 is empty",
        ),
        (
            r#"{"id": "a", "chunks": "x", "question": "q", "answer": "b"}"#,
            "expected",
        ),
        (
            "{\"id\": \"a\", \"chunks\": [\"x\"], \"question\": \"q\", \"answer\": \"b\"}\n\n{\"id\": \"a\", \"chunks\": [\"y\"], \"question\": \"q\", \"answer\": \"b\"}",
            "line 3: duplicate id",
        ),
        ("\n\n", "no tasks"),
    ];
    for (text, want) in cases {
        let err = parse_tasks(text, p).unwrap_err();
        assert!(matches!(err, Error::TaskFile { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("bad.jsonl") && msg.contains(want),
            "{msg:?} should mention {want:?}"
        );
    }
    let err = load_tasks(Path::new("/nonexistent/tasks.jsonl")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/tasks.jsonl"), "{err}");
    let ok = parse_tasks(
        r#"{"id": "a", "chunks": ["x"], "question": "q", "answer": "b", "extra": 1}"#,
        p,
    )
    .unwrap();
    assert_eq!(ok.len(), 1);
}

/// The 5- and 8-page suites (orbit patches beyond 4 chunks sample their orderings) are the
/// generator's output: `gen_tasks tasks/pagesN.jsonl 12 7 4 N`.
#[test]
fn the_five_and_eight_page_suites_are_in_sync() {
    for pages in [5, 8] {
        let cfg = GenConfig {
            seed: 7,
            tasks: 12,
            pages,
            filler: 4,
        };
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tasks/pages{pages}.jsonl"));
        let committed = load_tasks(&path).unwrap();
        assert_eq!(committed, generate(&cfg), "{} is stale", path.display());
        assert!(committed.iter().all(|t| t.chunks.len() == pages));
    }
}
