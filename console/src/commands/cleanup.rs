//! Cleanup intents: a deletion is recorded durably before its `DELETE` is sent and
//! removed only once absence is confirmed (the instance no longer in `/state`, or the
//! server answering that it has no such instance). The integration guide: "retain the
//! resource receipt and retry deletion … until absence is confirmed". `den delete`
//! writes and (when confirmed) clears them; `den reconcile` retries every one that is
//! left, so an interrupted or unconfirmed deletion is never forgotten.
//!
//! One JSON file per instance under `$XDG_STATE_HOME/den/cleanup-intents/`, written to a
//! temporary file, synced and renamed (a crash leaves the old file or the new one).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use den_protocol::skulk::InstanceId;

pub const CLEANUP_KIND: &str = "den-cleanup-intent";
pub const CLEANUP_VERSION: u32 = 1;
const PREFIX: &str = "cleanup-";
const SUFFIX: &str = ".json";

/// One deletion not yet confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupIntent {
    pub kind: String,
    pub version: u32,
    /// The management origin the deletion goes to.
    pub origin: String,
    pub instance_id: InstanceId,
    /// When the deletion was first asked for (UNIX ms).
    pub requested_at_unix_ms: u64,
    /// `DELETE`s sent so far.
    pub attempts: u32,
}

impl CleanupIntent {
    pub fn new(origin: impl Into<String>, instance_id: InstanceId, now_unix_ms: u64) -> Self {
        CleanupIntent {
            kind: CLEANUP_KIND.to_owned(),
            version: CLEANUP_VERSION,
            origin: origin.into(),
            instance_id,
            requested_at_unix_ms: now_unix_ms,
            attempts: 0,
        }
    }
}

/// The directory of cleanup intents.
#[derive(Debug, Clone)]
pub struct CleanupStore {
    dir: PathBuf,
}

impl CleanupStore {
    /// Beside the placement fences: `…/den/placement-fences` → `…/den/cleanup-intents`.
    pub fn beside_fences(fence_dir: &Path) -> CleanupStore {
        let dir = fence_dir.parent().map_or_else(
            || fence_dir.join("cleanup-intents"),
            |p| p.join("cleanup-intents"),
        );
        CleanupStore { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &InstanceId) -> PathBuf {
        // Instance ids come from the network: keep the file name to safe characters.
        let safe: String = id
            .as_str()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(96)
            .collect();
        self.dir.join(format!("{PREFIX}{safe}{SUFFIX}"))
    }

    /// Records (or updates) an intent durably; nothing may be sent until this returns Ok.
    pub fn save(&self, intent: &CleanupIntent) -> Result<PathBuf, String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cleanup directory {}: {e}", self.dir.display()))?;
        let path = self.path(&intent.instance_id);
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(intent).map_err(|e| e.to_string())?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            if let Ok(d) = std::fs::File::open(&self.dir) {
                let _ = d.sync_all();
            }
            Ok(())
        };
        write().map_err(|e| format!("cannot write cleanup intent {}: {e}", path.display()))?;
        Ok(path)
    }

    /// Absence confirmed: the intent goes.
    pub fn clear(&self, id: &InstanceId) -> Result<(), String> {
        let path = self.path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!(
                "cannot remove cleanup intent {}: {e}",
                path.display()
            )),
        }
    }

    /// Every stored intent, oldest first; a file that does not read is named, not
    /// skipped silently.
    pub fn list(&self) -> Vec<Result<CleanupIntent, String>> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(SUFFIX))
            })
            .collect();
        paths.sort();
        let mut out: Vec<Result<CleanupIntent, String>> = paths
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read cleanup intent {}: {e}", p.display()))?;
                let intent: CleanupIntent = serde_json::from_str(&text).map_err(|e| {
                    format!("cleanup intent {} is unreadable: {e}", p.display())
                })?;
                if intent.kind != CLEANUP_KIND || intent.version != CLEANUP_VERSION {
                    return Err(format!(
                        "cleanup intent {} is kind {:?} version {}, expected {CLEANUP_KIND} version {CLEANUP_VERSION}",
                        p.display(),
                        intent.kind,
                        intent.version
                    ));
                }
                Ok(intent)
            })
            .collect();
        out.sort_by_key(|r| r.as_ref().map_or(0, |i| i.requested_at_unix_ms));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_survive_until_cleared_and_bad_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CleanupStore::beside_fences(&dir.path().join("placement-fences"));
        assert!(store.list().is_empty());
        let mut intent = CleanupIntent::new("http://127.0.0.1:1", InstanceId::from("i-1/../x"), 5);
        let path = store.save(&intent).expect("saved");
        assert!(path.starts_with(store.dir()), "{}", path.display());
        intent.attempts = 1;
        store.save(&intent).expect("updated in place");
        let listed = store.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].as_ref().expect("reads").attempts, 1);
        std::fs::write(store.dir().join("cleanup-junk.json"), "{").expect("write");
        let listed = store.list();
        assert_eq!(listed.len(), 2);
        assert!(
            listed
                .iter()
                .any(|r| r.as_ref().is_err_and(|e| e.contains("cleanup-junk.json")))
        );
        store.clear(&InstanceId::from("i-1/../x")).expect("cleared");
        store
            .clear(&InstanceId::from("i-1/../x"))
            .expect("clearing twice is fine");
        assert_eq!(store.list().len(), 1);
    }
}
