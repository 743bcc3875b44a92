//! What a test needs from its environment, and what happens when it is missing.
//!
//! `tests/run` provides everything the suite needs (an S3 server, tmux, Python with the
//! `openai` client, model files) and sets [`REQUIRE_ALL`]; there a missing piece is a
//! failure, so no test passes by skipping. Run by hand (`cargo test`) without that
//! environment, such a test says "skipped: …" and returns.
//!
//! A test that needs hardware `tests/run` cannot provide (a CUDA GPU) is `#[ignore]`d with
//! a reason instead: it is reported as ignored, never as passed (`agent/gpu-check` runs it).

/// Set to `1` by `tests/run`.
pub const REQUIRE_ALL: &str = "DEN_TEST_REQUIRE_ALL";

/// True when every environment must be present (under `tests/run`).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| v == "1")
}

/// Reports that `what` is missing: a panic under `tests/run`, otherwise a "skipped" line.
/// The caller returns right after.
pub fn missing(what: &str) {
    if required() {
        panic!("{what}; {REQUIRE_ALL}=1 (tests/run), so this test may not pass by skipping");
    }
    println!("skipped: {what}");
}

/// The model files' directory (`DEN_TEST_MODELS`, filled by `tests/fetch-models`) when it
/// holds `file`; otherwise [`missing`] and `None`.
pub fn model_file(file: &str) -> Option<std::path::PathBuf> {
    match std::env::var_os("DEN_TEST_MODELS") {
        Some(dir) if !dir.is_empty() => {
            let path = std::path::PathBuf::from(dir).join(file);
            if path.is_file() {
                return Some(path);
            }
            missing(&format!(
                "{} is missing (run tests/fetch-models)",
                path.display()
            ));
            None
        }
        _ => {
            missing(
                "DEN_TEST_MODELS is not set (run tests/fetch-models and export what it prints)",
            );
            None
        }
    }
}
