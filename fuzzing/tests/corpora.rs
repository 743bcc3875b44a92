//! The fuzz corpora as ordinary tests: every seed (fuzz/seeds), every input the fuzzers
//! kept (fuzz/corpus, minimized) and every past crash (fuzz/regressions) runs through its
//! target on the stable toolchain. A target panics on a broken promise, so a regression
//! of anything a fuzzer once found fails here, without nightly or libFuzzer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_seed_corpus_input_and_past_crash_replays_cleanly() {
    let mut total = 0;
    // The GGUF seeds are built, not committed (no model file in the tree).
    for (name, data) in den_fuzzing::gguf_seeds() {
        let outcome = std::panic::catch_unwind(|| den_fuzzing::gguf(&data));
        assert!(outcome.is_ok(), "gguf failed on the built seed {name}");
    }
    for (target, run) in den_fuzzing::TARGETS {
        let seeds = inputs("seeds", target);
        assert!(
            *target == "gguf" || !seeds.is_empty(),
            "fuzz/seeds/{target} is empty: run fuzz/seed"
        );
        for kind in ["seeds", "corpus", "regressions"] {
            for path in inputs(kind, target) {
                let data = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(
                    outcome.is_ok(),
                    "{target} failed on {} (reproduce: cargo +nightly fuzz run -s none {target} {})",
                    path.display(),
                    path.display()
                );
                total += 1;
            }
        }
    }
    assert!(total > 0);
}

/// The seeds reach past each decoder's front door: they are valid inputs, so the
/// fuzzers start from the deep paths (the state reducer, dequantizers, replay) rather
/// than from rejections.
#[test]
fn the_seeds_are_inputs_the_decoders_accept() {
    let built = den_fuzzing::gguf_seeds();
    assert_eq!(built.len(), 9, "one seed per tensor type den reads");
    for (name, data) in built {
        let file = den_model::gguf::GgufFile::from_bytes(name.as_str(), data)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tensor = file.tensor_views().next().expect("one tensor");
        let mut row = vec![0f32; 256];
        tensor
            .dequantize_row(1, &mut row)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let me = den_protocol::ids::WorkerId::new("near");
    for path in inputs("seeds", "wire") {
        let data = std::fs::read(&path).unwrap();
        let ok = den_protocol::wire::decode_for_router(&data, 1 << 20).is_ok()
            || den_protocol::wire::decode_for_worker(&data, 1 << 20, &me).is_ok()
            || den_protocol::feed::decode(&data, 1 << 20).is_ok();
        assert!(ok, "{} decodes nowhere", path.display());
    }
    for path in inputs("seeds", "skulk") {
        let data = std::fs::read(&path).unwrap();
        if data.first() == Some(&0) {
            let text = String::from_utf8_lossy(&data[1..]);
            den_protocol::skulk::decode_response::<den_protocol::skulk::State>(200, &text, "state")
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    for path in inputs("seeds", "recording") {
        den_console::replay::Replayer::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    for path in inputs("seeds", "theme") {
        let text = std::fs::read_to_string(&path).unwrap();
        den_console::theme::Theme::parse(&text, "seed").unwrap();
    }
}

/// Writes the built GGUF seeds for libFuzzer (`fuzz/seed` runs it; they are not
/// committed: fuzz/.gitignore). Not a check.
#[test]
#[ignore = "exports fuzz seeds; fuzz/seed runs it"]
fn export_gguf_fuzz_seeds() {
    let Some(dir) = std::env::var_os("DEN_FUZZ_SEEDS") else {
        return;
    };
    let dir = Path::new(&dir).join("gguf");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in den_fuzzing::gguf_seeds() {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

/// Writes console-feed frames, encoded as the router sends them, as seeds of the `wire`
/// target (`fuzz/seed` runs it with DEN_FUZZ_SEEDS set). Not a check.
#[test]
#[ignore = "exports fuzz seeds; fuzz/seed runs it"]
fn export_feed_fuzz_seeds() {
    let Some(dir) = std::env::var_os("DEN_FUZZ_SEEDS") else {
        return;
    };
    let dir = Path::new(&dir).join("wire");
    std::fs::create_dir_all(&dir).unwrap();
    let mut kinds = std::collections::BTreeMap::new();
    for stamped in den_console::fixtures::scenario().unwrap() {
        if let den_protocol::session::SessionEvent::Feed { message, .. } = stamped.event {
            let text = den_protocol::feed::encode(&message);
            let kind = serde_json::from_str::<serde_json::Value>(&text).unwrap()["type"]
                .as_str()
                .unwrap_or("frame")
                .to_owned();
            let n = kinds.entry(kind.clone()).or_insert(0);
            *n += 1;
            if *n <= 3 {
                std::fs::write(dir.join(format!("feed-{kind}-{n}.json")), text).unwrap();
            }
        }
    }
}
