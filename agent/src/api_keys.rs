//! Inference API keys: a second, narrower credential than the cluster token.
//!
//! `--api-keys-file PATH` names a file of keys, one per line (blank lines and lines
//! starting with `#` are ignored). A key reaches only the inference endpoints — the OpenAI
//! ingress (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/tokenize`,
//! `/detokenize`) and `/v1/generate` — and gets 403 on everything else (workers,
//! consoles, management, cancel, drain), which keep needing the cluster token. The file is
//! re-read when its modification time or size changes, checked at most once a second on
//! use, so keys are added and revoked without a restart. A file that becomes unreadable or
//! invalid keeps the keys last read (logged once per change): a typo never opens or
//! closes the door by itself. Keys are compared in constant time and never logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use subtle::ConstantTimeEq;

/// Shortest key accepted: guessable keys are a configuration error.
pub const MIN_KEY_LEN: usize = 16;
/// How often a use may look at the file again.
const RECHECK: Duration = Duration::from_secs(1);

/// The keys of one file, reloaded on change. Cheap to clone (shared).
#[derive(Clone)]
pub struct ApiKeys {
    inner: Arc<Mutex<State>>,
}

struct State {
    path: PathBuf,
    keys: Vec<Vec<u8>>,
    /// (modified, len) of the file as last read.
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKeys(<redacted>)")
    }
}

impl ApiKeys {
    /// Reads `path`; one-line errors name the file and the line, never a key.
    pub fn from_file(path: &Path) -> Result<ApiKeys, String> {
        let (keys, stamp) = read(path)?;
        Ok(ApiKeys {
            inner: Arc::new(Mutex::new(State {
                path: path.to_path_buf(),
                keys,
                stamp,
                checked: Instant::now(),
            })),
        })
    }

    /// Whether `presented` (the bearer secret) is one of the keys, after re-reading the
    /// file if it changed.
    pub fn contains(&self, presented: &str) -> bool {
        let mut state = match self.inner.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        state.refresh();
        // Every key is compared, so the time taken does not say which one matched.
        let mut found = subtle::Choice::from(0u8);
        for k in &state.keys {
            found |= k.as_slice().ct_eq(presented.as_bytes());
        }
        found.into()
    }

    /// How many keys are loaded now.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |s| s.keys.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl State {
    fn refresh(&mut self) {
        if self.checked.elapsed() < RECHECK {
            return;
        }
        self.checked = Instant::now();
        let now = stamp_of(&self.path);
        if now.is_some() && now == self.stamp {
            return;
        }
        match read(&self.path) {
            Ok((keys, stamp)) => {
                tracing::info!(path = %self.path.display(), keys = keys.len(), "API keys reloaded");
                self.keys = keys;
                self.stamp = stamp;
            }
            Err(e) => {
                // Keep the last good keys; say so once for this state of the file.
                if now != self.stamp {
                    tracing::warn!("API keys not reloaded, the previous ones stay in force: {e}");
                }
                self.stamp = now;
            }
        }
    }
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The file's keys, and its stamp read before the contents (a write racing the read is
/// seen again at the next check).
type Loaded = (Vec<Vec<u8>>, Option<(SystemTime, u64)>);

fn read(path: &Path) -> Result<Loaded, String> {
    let stamp = stamp_of(path);
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the API keys file {}: {e}", path.display()))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let key = line.trim();
        if key.is_empty() || key.starts_with('#') {
            continue;
        }
        if key.len() < MIN_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "the API keys file {} line {}: a key is at least {MIN_KEY_LEN} printable characters without spaces",
                path.display(),
                i + 1
            ));
        }
        keys.push(key.as_bytes().to_vec());
    }
    Ok((keys, stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_load_reload_and_survive_a_bad_edit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            "# clients\nkey-aaaaaaaaaaaaaaaa\n\nkey-bbbbbbbbbbbbbbbb\n",
        )
        .unwrap();
        let keys = ApiKeys::from_file(&path).unwrap();
        assert_eq!(keys.len(), 2);
        assert!(keys.contains("key-aaaaaaaaaaaaaaaa"));
        assert!(!keys.contains("key-aaaaaaaaaaaaaaa"));
        assert!(!keys.contains(""));
        assert!(!format!("{keys:?}").contains("key-"));
        // Revoke a, add c: seen after the recheck interval.
        std::fs::write(&path, "key-bbbbbbbbbbbbbbbb\nkey-cccccccccccccccc\n").unwrap();
        keys.inner.lock().unwrap().checked = Instant::now() - RECHECK;
        assert!(!keys.contains("key-aaaaaaaaaaaaaaaa"));
        assert!(keys.contains("key-cccccccccccccccc"));
        // A bad edit keeps the keys in force.
        std::fs::write(&path, "short\n").unwrap();
        keys.inner.lock().unwrap().checked = Instant::now() - RECHECK;
        assert!(keys.contains("key-cccccccccccccccc"));
        let e = ApiKeys::from_file(&path).unwrap_err();
        assert!(e.contains("line 1") && !e.contains("short"), "{e}");
        assert!(ApiKeys::from_file(&dir.path().join("absent")).is_err());
    }
}
