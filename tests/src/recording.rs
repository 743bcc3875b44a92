//! Helpers for the recording tests: the `den` binary and reading recordings back as
//! bytes and lines (plain or zstd).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::process::{binary, cargo_build};

/// The `den` binary, built once per test binary when it is missing.
pub fn den_binary() -> PathBuf {
    static DEN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = DEN.get_or_init(|| {
        binary("den").or_else(|_| {
            cargo_build("den-console")?;
            binary("den")
        })
    });
    match found {
        Ok(p) => p.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// Runs the real `den record --duration DURATION ARGS… FILE` with no inherited den
/// settings (`XDG_CONFIG_HOME` is `config_home`) until it says it recorded; panics with
/// its stderr when it does not within 30 s.
pub fn den_record(duration: &str, args: &[&str], file: &Path, config_home: &Path) {
    let mut cmd = std::process::Command::new(den_binary());
    cmd.args(["record", "--duration", duration])
        .args(args)
        .arg(file)
        .env_remove("DEN_CONFIG")
        .env_remove("DEN_TOKEN")
        .env("XDG_CONFIG_HOME", config_home);
    let den = match crate::ChildGuard::spawn(cmd, "den record") {
        Ok(den) => den,
        Err(e) => panic!("den record: {e}"),
    };
    let done = den.wait_for_stderr(std::time::Duration::from_secs(30), |l| {
        l.contains("recorded ")
    });
    assert!(done.is_some(), "{}", den.stderr_tail(20));
}

/// The bytes of a recording file, decompressed when it is `.zst` (as far as the stream
/// goes: a crash leaves a truncated frame).
pub fn recording_bytes(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_default();
    if !path.to_string_lossy().ends_with(".zst") {
        return raw;
    }
    let mut out = Vec::new();
    if let Ok(mut d) = zstd::stream::read::Decoder::new(raw.as_slice()) {
        // An error at the end is the torn tail; everything before it is kept.
        let mut buf = [0u8; 64 * 1024];
        loop {
            match std::io::Read::read(&mut d, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(buf.get(..n).unwrap_or_default()),
            }
        }
    }
    out
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}
