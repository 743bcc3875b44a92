//! The worker's credential, persisted in `DATA_DIR/identity`.
//!
//! The shared cluster token lets a process connect; it does not make it a particular
//! worker. On first start a worker draws 32 random bytes from the operating system and
//! keeps them (mode 0600, written atomically); every hello carries them, and the router
//! pins the first credential it sees for a worker name. A restart of the same worker reads
//! the same file and takes over its name cleanly with a new epoch; another process with
//! only the token cannot.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Why the credential could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot use worker identity file {path}: {source}; check --data-dir")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "worker identity file {path} does not hold 64 hexadecimal digits: delete it to enrol this worker anew (the router must then be restarted to forget the old one)"
    )]
    Corrupt { path: String },
}

/// The credential in `dir/identity`, made on first use.
pub fn load_or_create(dir: &Path) -> Result<String, IdentityError> {
    let path = dir.join("identity");
    let io = |source| IdentityError::Io {
        path: path.display().to_string(),
        source,
    };
    match fs::read_to_string(&path) {
        Ok(s) => {
            let s = s.trim();
            if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(s.to_ascii_lowercase());
            }
            return Err(IdentityError::Corrupt {
                path: path.display().to_string(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    fs::create_dir_all(dir).map_err(io)?;
    let mut secret = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .map_err(io)?;
    let hex = hex::encode(secret);
    let tmp = dir.join("identity.tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    f.write_all(hex.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    fs::rename(&tmp, &path).map_err(io)?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_is_made_once_kept_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(load_or_create(dir.path()).unwrap(), a);
        let mode = fs::metadata(dir.path().join("identity"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "readable by others: {mode:o}");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create(other.path()).unwrap(), a);
        fs::write(dir.path().join("identity"), "junk").unwrap();
        let e = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("64 hexadecimal digits") && !e.contains('\n'),
            "{e}"
        );
    }
}
