//! `den status` against the in-process management API and feed of
//! [`crate::testing::fake_api`].

use std::sync::Arc;
use std::time::Duration;

use den_protocol::session::SourceKind;

use super::*;
use crate::config::SourceSpec;
use crate::fixtures::{ALPHA, BRAVO};
use crate::testing::fake_api::{Fake, TOKEN, serve, settings, skulk};

#[tokio::test]
async fn status_against_the_skulk_captures_reports_nodes_downloads_and_verdicts() {
    crate::http::install_crypto_provider();
    let url = serve(Fake::skulk()).await;
    let g = gather(
        &settings(vec![skulk("mgmt", &url)], None),
        Duration::from_secs(5),
    )
    .await
    .expect("gather");
    assert_eq!(exit_code(&g), 0, "{:?}", g.problems);
    let json: serde_json::Value = serde_json::from_str(&snapshot_json(&g, true)).expect("json");
    assert_eq!(json["complete"], true);
    let nodes: Vec<&str> = json["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["node"].as_str())
        .collect();
    assert_eq!(nodes, [ALPHA, BRAVO]);
    assert_eq!(json["nodes"][0]["identity"]["state"], "bound");
    assert_eq!(json["downloads"].as_array().map(Vec::len), Some(5));
    let verdicts: Vec<&str> = json["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter(|r| r["row"] == "instance")
        .filter_map(|r| r["verdict"]["kind"].as_str())
        .collect();
    // one instance has all evidence but no probe; the other's download failed on bravo
    // (no space left), which Skulk never retries: failed at once, not "not ready … in 14m"
    assert_eq!(verdicts, ["unprobed", "failed"]);
    let text = snapshot_text(&g);
    assert!(text.contains("INSTANCES (2)"), "{text}");
    assert!(text.contains("No space left on device"), "{text}");
}

#[tokio::test]
async fn a_router_source_uses_its_token_for_feed_and_api() {
    crate::http::install_crypto_provider();
    let url = serve(Fake::router()).await;
    let router = SourceSpec {
        id: "router".into(),
        kind: SourceKind::DenRouter,
        url: url.clone(),
    };
    let g = gather(
        &settings(vec![router.clone()], Some(TOKEN)),
        Duration::from_secs(5),
    )
    .await
    .expect("gather");
    assert_eq!(exit_code(&g), 0, "{:?}", g.problems);
    assert_eq!(g.model.routes().len(), 5);
    assert_eq!(g.model.views().pages.len(), 2);
    let json = snapshot_json(&g, true);
    assert!(!json.contains(TOKEN));

    // without the token neither the API nor the feed answers: a failure, exit 1
    let g = gather(&settings(vec![router], None), Duration::from_secs(3))
        .await
        .expect("gather");
    assert_eq!(exit_code(&g), 1);
    let why = g.problems.get(&SourceId::from("router")).expect("problem");
    assert!(why.contains("401"), "{why}");
}

#[tokio::test]
async fn an_unreachable_source_makes_the_snapshot_partial() {
    crate::http::install_crypto_provider();
    let url = serve(Fake::skulk()).await;
    let sources = vec![skulk("mgmt", &url), skulk("gone", "http://127.0.0.1:9")];
    let g = gather(&settings(sources, None), Duration::from_secs(5))
        .await
        .expect("gather");
    assert_eq!(exit_code(&g), 2);
    assert_eq!(
        g.answered.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ["mgmt"]
    );
    assert!(
        g.problems
            .get(&SourceId::from("gone"))
            .is_some_and(|p| p.contains("GET /state"))
    );
    let json: serde_json::Value = serde_json::from_str(&snapshot_json(&g, false)).expect("json");
    assert_eq!(json["complete"], false);
    assert!(
        gather(&settings(vec![], None), Duration::from_secs(1))
            .await
            .is_err()
    );
}

/// A Skulk `/state` needs no den token: names in it must not reach the operator's
/// terminal as control sequences (OSC 52 writes the clipboard, CSI 2J clears the screen)
/// or forge lines with a newline.
#[tokio::test]
async fn status_text_strips_escape_sequences_from_network_names() {
    crate::http::install_crypto_provider();
    let mut fake = Fake::skulk();
    let hostile = (*fake.state)
        .replace(
            "\"friendlyName\": \"alpha\"",
            "\"friendlyName\": \"al\\u001b]52;c;ZXZpbA==\\u0007pha\\u001b[2J\"",
        )
        .replace(
            "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
            "mlx-community/Meta\\nFORGED LINE\\u001b]0;owned\\u0007",
        );
    assert_ne!(
        hostile, *fake.state,
        "the fixture has the fields this test poisons"
    );
    fake.state = Arc::new(hostile);
    let url = serve(fake).await;
    let g = gather(
        &settings(vec![skulk("mgmt", &url)], None),
        Duration::from_secs(5),
    )
    .await
    .expect("gather");
    let text = snapshot_text(&g);
    assert!(text.contains("NODES"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "a newline in a model name became a line of its own: {text}"
    );
}

/// A `/state` larger than den reads is refused with one line, not buffered whole.
#[tokio::test]
async fn an_oversized_state_is_refused_not_read_whole() {
    crate::http::install_crypto_provider();
    let mut fake = Fake::skulk();
    let mut huge = String::with_capacity(crate::http::MAX_RESPONSE_BYTES + 16);
    huge.push_str("{\"pad\":\"");
    huge.push_str(&"x".repeat(crate::http::MAX_RESPONSE_BYTES));
    huge.push_str("\"}");
    fake.state = Arc::new(huge);
    let url = serve(fake).await;
    let g = gather(
        &settings(vec![skulk("mgmt", &url)], None),
        Duration::from_secs(20),
    )
    .await
    .expect("gather");
    assert_eq!(exit_code(&g), 1, "{:?}", g.problems);
    let problems = join_problems(&g.problems);
    assert!(problems.contains("refusing to read it"), "{problems}");
}
