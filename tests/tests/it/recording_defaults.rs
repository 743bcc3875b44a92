//! Every `den demo` session leaves a recording unless told not to: by default under the
//! recordings directory (`DEN_RECORDINGS_DIR` here, so that tests never write into
//! `$HOME`), at `--record PATH` when given, nowhere with `--no-record`; the path is
//! printed on exit and the file replays.

use std::path::{Path, PathBuf};
use std::process::Command;

use den_tests::recording::den_binary;

/// Run `den ARGS` with the default recordings directory at `dir`.
fn den(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(den_binary())
        .args(args)
        .env("DEN_RECORDINGS_DIR", dir)
        .env_remove("DEN_CONFIG")
        .env_remove("DEN_ROUTER")
        .env_remove("DEN_SKULK")
        .env_remove("DEN_TOKEN")
        // These tests are about recordings: the synthetic engine keeps their few seconds
        // of demo busy whether or not a real model is cached.
        .env("DEN_MODEL_FILE", "")
        .env("DEN_MODEL_CACHE", dir.join("no-models"))
        .output()
        .expect("run den");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The summary of a recording names the demo's workers joining.
fn assert_replays_the_demo(file: &Path, dir: &Path) {
    let (code, out, err) = den(dir, &["replay", file.to_str().expect("path"), "--summary"]);
    assert_eq!(code, Some(0), "{err}");
    for worker in ["w-1", "w-2"] {
        assert!(
            out.contains(&format!("worker {worker} joined")),
            "{worker} missing:\n{out}"
        );
    }
}

#[test]
fn den_demo_headless_records_by_default_and_prints_the_path() {
    let dir = den_tests::temp_dir().expect("temp dir");
    let (code, out, err) = den(
        dir.path(),
        &["demo", "--headless", "--duration", "3s", "--workers", "2"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("requests:"), "the demo's summary: {out}");
    let files = files_in(dir.path());
    assert_eq!(files.len(), 1, "one recording: {files:?}");
    let file = &files[0];
    let name = file.to_string_lossy();
    assert!(name.ends_with(".jsonl.zst"), "{name}");
    assert!(err.contains("recorded "), "{err}");
    assert!(err.contains(&format!("den replay {name}")), "{err}");
    assert_replays_the_demo(file, dir.path());
}

#[test]
fn den_demo_records_to_record_path_and_not_at_all_with_no_record() {
    let dir = den_tests::temp_dir().expect("temp dir");
    let default_dir = dir.path().join("default");
    std::fs::create_dir_all(&default_dir).expect("mkdir");
    let chosen = dir.path().join("chosen.jsonl");
    let (code, _, err) = den(
        &default_dir,
        &[
            "--record",
            chosen.to_str().expect("path"),
            "demo",
            "--headless",
            "--duration",
            "2s",
            "--workers",
            "2",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(chosen.exists(), "{err}");
    assert!(
        err.contains(&format!("den replay {}", chosen.display())),
        "{err}"
    );
    assert!(files_in(&default_dir).is_empty());
    assert_replays_the_demo(&chosen, dir.path());

    let (code, _, err) = den(
        &default_dir,
        &["--no-record", "demo", "--headless", "--duration", "1s"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        files_in(&default_dir).is_empty(),
        "--no-record wrote a file"
    );
    assert!(!err.contains("recorded "), "{err}");
}
