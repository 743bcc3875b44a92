//! Submission fences on disk: one file per instance id in a directory.
//!
//! A fence is written atomically and durably before `POST /instance` is sent: a temporary
//! file is written and fsynced, renamed over `fence-<instance id>.json`, and the directory
//! is fsynced so the rename itself survives a crash. Only then does the driver answer
//! `FencePersisted`. A fence is removed once its outcome is definitive (placed or
//! failed) and kept for an uncertain one.
//!
//! File format (JSON):
//! ```text
//! { "kind": "den-placement-fence", "version": 1,
//!   "origin": "http://127.0.0.1:52415",        management origin it was submitted to
//!   "fence": { …den_protocol::placement::Fence… } }
//! ```
//! The fence's `created_at`, `reconcile_deadline` and `hard_expiry` are wall-clock UNIX
//! milliseconds on disk (see [`super::clock`]).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use den_protocol::placement::Fence;
use den_protocol::skulk::InstanceId;
use den_protocol::skulk::http::percent_encode;

/// The `kind` every fence file carries.
pub const FENCE_KIND: &str = "den-placement-fence";
/// The version of the file envelope.
pub const FENCE_FILE_VERSION: u32 = 1;

const PREFIX: &str = "fence-";
const SUFFIX: &str = ".json";

/// A fence as stored: the envelope around the workflow's [`Fence`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredFence {
    pub kind: String,
    pub version: u32,
    /// The management origin the submission went to, e.g. `http://127.0.0.1:52415`.
    pub origin: String,
    /// The compute node's own API that was polled beside it (`--compute`), so that a
    /// resumed reconciliation polls both sides again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<String>,
    /// Times in wall-clock UNIX milliseconds.
    pub fence: Fence,
}

impl StoredFence {
    pub fn new(origin: impl Into<String>, fence_unix: Fence) -> StoredFence {
        StoredFence {
            kind: FENCE_KIND.to_owned(),
            version: FENCE_FILE_VERSION,
            origin: origin.into(),
            compute: None,
            fence: fence_unix,
        }
    }

    pub fn instance_id(&self) -> &InstanceId {
        &self.fence.instance_id
    }
}

/// Why a fence could not be stored, read or removed. Every message names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    #[error("fence directory {}: {detail}", path.display())]
    Dir { path: PathBuf, detail: String },
    #[error("cannot write fence {}: {detail}", path.display())]
    Write { path: PathBuf, detail: String },
    #[error("cannot read fence {}: {detail}", path.display())]
    Read { path: PathBuf, detail: String },
    #[error(
        "fence file {} is not a valid placement fence ({detail}); inspect it and move it \
         aside once the placement it records has been reconciled",
        path.display()
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error("cannot remove fence {}: {detail}", path.display())]
    Remove { path: PathBuf, detail: String },
}

/// One fence file found by [`FenceStore::list`]: its path and what it held.
#[derive(Debug, Clone, PartialEq)]
pub struct FenceEntry {
    pub path: PathBuf,
    pub fence: Result<StoredFence, FenceError>,
}

/// A directory of fence files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceStore {
    dir: PathBuf,
}

impl FenceStore {
    /// Opens `dir`, creating it (and its parents) if needed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<FenceStore, FenceError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| FenceError::Dir {
            path: dir.clone(),
            detail: e.to_string(),
        })?;
        Ok(FenceStore { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds the fence of `id`.
    pub fn path_of(&self, id: &InstanceId) -> PathBuf {
        self.dir
            .join(format!("{PREFIX}{}{SUFFIX}", percent_encode(id.as_str())))
    }

    /// Writes the fence atomically and durably; returns its path once it is on disk.
    pub fn write(&self, fence: &StoredFence) -> Result<PathBuf, FenceError> {
        let path = self.path_of(fence.instance_id());
        let write_err = |detail: String| FenceError::Write {
            path: path.clone(),
            detail,
        };
        let json = serde_json::to_vec_pretty(fence).map_err(|e| write_err(e.to_string()))?;
        let tmp = self.temp_path(fence.instance_id());
        let result = (|| -> std::io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            file.write_all(&json)?;
            file.write_all(b"\n")?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, &path)?;
            sync_dir(&self.dir)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(write_err(e.to_string()));
        }
        Ok(path)
    }

    /// The stored fence of `id`, if there is one.
    pub fn load(&self, id: &InstanceId) -> Result<Option<StoredFence>, FenceError> {
        let path = self.path_of(id);
        if !path.exists() {
            return Ok(None);
        }
        let fence = read_fence(&path)?;
        if fence.instance_id() != id {
            return Err(FenceError::Corrupt {
                detail: format!("it holds instance {} instead of {id}", fence.instance_id()),
                path,
            });
        }
        Ok(Some(fence))
    }

    /// Every fence file in the directory, sorted by path. A file that cannot be read or
    /// parsed is listed with its error; it never stops the others from loading.
    pub fn list(&self) -> Result<Vec<FenceEntry>, FenceError> {
        let dir_err = |e: std::io::Error| FenceError::Dir {
            path: self.dir.clone(),
            detail: e.to_string(),
        };
        let mut paths = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(dir_err)? {
            let path = entry.map_err(dir_err)?.path();
            let is_fence = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(PREFIX) && n.ends_with(SUFFIX) && n.len() > PREFIX.len() + 5
            });
            if is_fence && path.is_file() {
                paths.push(path);
            }
        }
        paths.sort();
        Ok(paths
            .into_iter()
            .map(|path| {
                let fence = read_fence(&path).and_then(|f| {
                    if self.path_of(f.instance_id()) == path {
                        Ok(f)
                    } else {
                        Err(FenceError::Corrupt {
                            path: path.clone(),
                            detail: format!(
                                "it holds instance {}, which belongs in {}",
                                f.instance_id(),
                                self.path_of(f.instance_id()).display()
                            ),
                        })
                    }
                });
                FenceEntry { path, fence }
            })
            .collect())
    }

    /// Removes the fence of `id` (durably); absent is fine.
    pub fn remove(&self, id: &InstanceId) -> Result<(), FenceError> {
        let path = self.path_of(id);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map_err(|e| FenceError::Remove {
                path,
                detail: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(FenceError::Remove {
                path,
                detail: e.to_string(),
            }),
        }
    }

    /// A temporary name that `list` ignores (leading dot) and that no other writer in
    /// this or another process uses at the same time.
    fn temp_path(&self, id: &InstanceId) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!(
            ".{PREFIX}{}{SUFFIX}.{}-{n}.tmp",
            percent_encode(id.as_str()),
            std::process::id()
        ))
    }
}

fn read_fence(path: &Path) -> Result<StoredFence, FenceError> {
    let text = fs::read_to_string(path).map_err(|e| FenceError::Read {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    let corrupt = |detail: String| FenceError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    let fence: StoredFence = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    if fence.kind != FENCE_KIND {
        return Err(corrupt(format!(
            "kind {:?}, expected {FENCE_KIND:?}",
            fence.kind
        )));
    }
    if fence.version != FENCE_FILE_VERSION || fence.fence.version != Fence::VERSION {
        return Err(corrupt(format!(
            "version {}/{}, this den reads {FENCE_FILE_VERSION}/{}",
            fence.version,
            fence.fence.version,
            Fence::VERSION
        )));
    }
    Ok(fence)
}

/// Makes a rename or removal in `dir` durable. Directories cannot be opened for sync on
/// every platform; where they cannot, the rename is as durable as the platform makes it.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = (dir, File::open);
        Ok(())
    }
}
