//! Shared helpers of the Skulk, evidence and placement tests: reading the vendored
//! Skulk 1.3.0 fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use den_protocol::skulk::State;

pub const RUN_C_NODE: &str = "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L";
pub const RUN_C_INSTANCE: &str = "85bbd162-8da4-450c-b05b-3e04ac3b9a99";
pub const RUN_C_RUNNER: &str = "a9393fdd-1b5c-49ce-8598-a89163c9f0f8";
pub const RUN_C_MODEL: &str = "mlx-community/Llama-3.2-1B-Instruct-4bit";
pub const RUN_C_FAILURE: &str = "module 'mlx.core' has no attribute 'new_thread_local_stream'";
pub const CREATED_INSTANCE: &str = "cff479d0-3939-4513-8d59-e5b967b6c9ad";
pub const CREATED_RUNNER: &str = "6954210c-447d-403a-892a-ab35c39bc2de";
pub const ALPHA: &str = "12D3KooWDerivedNodeAlphaXXXXXXXXXXXXXXXXXXXXXXXXXXXX";
pub const BRAVO: &str = "12D3KooWDerivedNodeBravoXXXXXXXXXXXXXXXXXXXXXXXXXXXX";

/// `tests/fixtures/skulk-1.3.0` of the workspace.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/skulk-1.3.0")
}

pub fn read(rel: &str) -> String {
    let path = fixture_dir().join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()))
}

pub fn state(rel: &str) -> State {
    serde_json::from_str(&read(rel))
        .unwrap_or_else(|e| panic!("{rel} does not parse as /state: {e}"))
}

/// The status code of a `.headers` file (`HTTP/1.1 404 `).
pub fn status_of(headers: &str) -> u16 {
    let first = headers.lines().next().unwrap_or_default();
    first
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status code in {first:?}"))
}

/// Every file under the fixture directory, as paths relative to it, sorted.
pub fn all_fixture_files() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("fixture dir")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .expect("under root")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push(rel);
            }
        }
    }
    let root = fixture_dir();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}
