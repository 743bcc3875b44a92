//! The worker's process generation, persisted in `DATA_DIR/epoch`.
//!
//! Every process start reads the stored epoch, adds one and makes the new value durable
//! (write to a temporary file, fsync, rename, fsync the directory) before the worker
//! connects, so offers built from an earlier process's observations are always declined
//! `worker-epoch-changed`, even across a crash right after start-up.

use std::fs;
use std::io::Write;
use std::path::Path;

use den_protocol::ids::Epoch;

/// Why the epoch could not be advanced.
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error(
        "cannot use data directory {dir}: {source}; check that it exists and is writable (--data-dir)"
    )]
    Dir { dir: String, source: std::io::Error },
    #[error("epoch file {path} holds {content:?}, not a number: fix or delete it")]
    Corrupt { path: String, content: String },
    #[error("cannot write epoch file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Read `dir/epoch` (absent means 0), store and return the next epoch.
pub fn advance(dir: &Path) -> Result<Epoch, EpochError> {
    fs::create_dir_all(dir).map_err(|source| EpochError::Dir {
        dir: dir.display().to_string(),
        source,
    })?;
    let path = dir.join("epoch");
    let previous = match fs::read_to_string(&path) {
        Ok(s) => s.trim().parse::<u64>().map_err(|_| EpochError::Corrupt {
            path: path.display().to_string(),
            content: s.chars().take(40).collect(),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(source) => {
            return Err(EpochError::Dir {
                dir: dir.display().to_string(),
                source,
            });
        }
    };
    let next = Epoch(previous).next();
    let tmp = dir.join("epoch.tmp");
    let write = |p: &Path| -> std::io::Result<()> {
        let mut f = fs::File::create(p)?;
        writeln!(f, "{}", next.0)?;
        f.sync_all()?;
        fs::rename(p, &path)?;
        fs::File::open(dir)?.sync_all()
    };
    write(&tmp).map_err(|source| EpochError::Write {
        path: path.display().to_string(),
        source,
    })?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_start_gets_a_larger_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let a = advance(dir.path()).unwrap();
        let b = advance(dir.path()).unwrap();
        assert_eq!((a, b), (Epoch(1), Epoch(2)));
        fs::write(dir.path().join("epoch"), "garbage").unwrap();
        let e = advance(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a number"), "{e}");
    }
}
