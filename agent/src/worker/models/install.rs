//! Installed artifacts on disk: `DATA_DIR/models/<card digest>/` holds the files and an
//! `installed.json` marker written last (before the directory is renamed into place), so
//! a directory with a marker is a complete, verified installation. Downloads stage under
//! `DATA_DIR/models/.staging/<attempt id>/`; leftovers of a crash are removed at start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use den_protocol::skulk::{AttemptId, ModelId};
use den_protocol::wire::ArtifactFile;

/// Name of the marker file inside an installation.
pub const MARKER: &str = "installed.json";
/// Where downloads are staged, under the models directory.
pub const STAGING: &str = ".staging";

/// What the marker records: which attempt installed what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub attempt_id: AttemptId,
    pub model_id: ModelId,
    pub card_digest: String,
    pub bytes_total: u64,
    pub files: Vec<ArtifactFile>,
    pub installed_at_unix_ms: u64,
}

/// A complete installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub dir: PathBuf,
    pub marker: Marker,
}

/// Prepares `models_dir` (creating it, removing stale staging) and returns the
/// installations found there, by card digest. Directories without a readable marker, or
/// whose marker names another digest, are ignored (and logged).
pub fn scan(models_dir: &Path) -> std::io::Result<BTreeMap<String, Installed>> {
    std::fs::create_dir_all(models_dir)?;
    let staging = models_dir.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(models_dir)? {
        let entry = entry?;
        let dir = entry.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if !dir.is_dir() || name.starts_with('.') {
            continue;
        }
        match read_marker(&dir) {
            Ok(marker) if marker.card_digest == name => {
                found.insert(name, Installed { dir, marker });
            }
            Ok(_) => {
                tracing::warn!(dir = %dir.display(), "installation marker names another card; ignoring it")
            }
            Err(e) => tracing::warn!(dir = %dir.display(), "incomplete installation ignored: {e}"),
        }
    }
    Ok(found)
}

pub fn read_marker(dir: &Path) -> Result<Marker, String> {
    let text = std::fs::read_to_string(dir.join(MARKER)).map_err(|e| format!("no marker: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("unreadable marker: {e}"))
}

/// Removes an installation (found corrupt): the next placement downloads it again.
pub fn uninstall(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), "cannot remove a corrupt installation: {e}");
    }
}

/// `dir/path` for a validated relative artifact path.
pub fn file_path(dir: &Path, path: &str) -> PathBuf {
    path.split('/')
        .fold(dir.to_path_buf(), |p, seg| p.join(seg))
}

/// fsync a directory (its entries are durable after a rename).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_keeps_marked_installations_and_clears_staging() {
        let tmp = tempfile::tempdir().unwrap();
        let models = tmp.path().join("models");
        std::fs::create_dir_all(models.join(STAGING).join("a1")).unwrap();
        let digest = "d".repeat(64);
        let good = models.join(&digest);
        std::fs::create_dir_all(&good).unwrap();
        let marker = Marker {
            attempt_id: "a0".into(),
            model_id: "m".into(),
            card_digest: digest.clone(),
            bytes_total: 3,
            files: vec![],
            installed_at_unix_ms: 1,
        };
        std::fs::write(good.join(MARKER), serde_json::to_vec(&marker).unwrap()).unwrap();
        std::fs::create_dir_all(models.join("e".repeat(64))).unwrap(); // no marker
        let found = scan(&models).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[&digest].marker, marker);
        assert!(!models.join(STAGING).exists());
        assert_eq!(file_path(&good, "a/b"), good.join("a").join("b"));
    }
}
