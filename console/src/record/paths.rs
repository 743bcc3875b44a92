//! Recording file names: the default location, segment names after rotation, and the
//! retention sweep that keeps recordings from filling the disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Extensions of recordings, longest first.
const EXTENSIONS: &[&str] = &[".jsonl.zst", ".jsonl", ".zst"];

/// The environment variable that overrides [`default_dir`] (scripts and tests point
/// it at a directory of their own).
pub const DIR_ENV: &str = "DEN_RECORDINGS_DIR";

/// `$DEN_RECORDINGS_DIR`, else `$XDG_DATA_HOME/den/recordings` (the platform's data
/// directory: `~/.local/share/den/recordings` on Linux).
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => dirs::data_dir().map(|d| d.join("den").join("recordings")),
    }
}

/// The default recording of a session started at `unix_ms` on `host`:
/// `<data dir>/den/recordings/20250615-143000-host.jsonl.zst`.
pub fn default_path(unix_ms: u64, host: &str) -> Option<PathBuf> {
    default_dir().map(|d| d.join(default_name(unix_ms, host)))
}

pub fn default_name(unix_ms: u64, host: &str) -> String {
    format!("{}-{}.jsonl.zst", utc_stamp(unix_ms), file_safe(host))
}

/// Whether a path names a zstd-compressed recording.
pub fn is_compressed(path: &Path) -> bool {
    path.to_string_lossy().ends_with(".zst")
}

/// Split a file name into its stem and recording extension (`a.jsonl.zst` → `a`,
/// `.jsonl.zst`); names without one have an empty extension.
fn split_name(name: &str) -> (&str, &str) {
    for ext in EXTENSIONS {
        if let Some(stem) = name.strip_suffix(ext)
            && !stem.is_empty()
        {
            return (stem, ext);
        }
    }
    (name, "")
}

/// The file of segment `n` of the recording whose first segment is `first`:
/// `x.jsonl` → `x.1.jsonl`, `x.2.jsonl`, …
pub fn segment_path(first: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return first.to_path_buf();
    }
    let name = first
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (stem, ext) = split_name(&name);
    first.with_file_name(format!("{stem}.{n}{ext}"))
}

/// The first segment's path, given segment `n`'s path.
pub fn first_segment(path: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (stem, ext) = split_name(&name);
    let suffix = format!(".{n}");
    let stem = stem.strip_suffix(&suffix).unwrap_or(stem);
    path.with_file_name(format!("{stem}{ext}"))
}

/// The machine's name, for headers and default file names.
pub fn host_name() -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    read("/proc/sys/kernel/hostname")
        .or_else(|| read("/etc/hostname"))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `s` with everything but letters, digits, `-` and `_` replaced by `_` (at most 64).
pub fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// `YYYYMMDD-HHMMSS` in UTC.
pub fn utc_stamp(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// How much recording to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Total bytes of recordings kept (oldest deleted first).
    pub max_total_bytes: u64,
    /// Recordings older than this are deleted.
    pub max_age: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_total_bytes: 2 * 1024 * 1024 * 1024,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Delete recording files in `dir` beyond the retention limits, oldest first, never
/// one in `keep`. Only files with a recording extension are considered; when `only` is
/// given, only the segments of that recording (names starting with its stem). Returns
/// the deleted paths.
pub fn sweep(
    dir: &Path,
    only: Option<&Path>,
    retention: Retention,
    keep: &[PathBuf],
    now: SystemTime,
) -> Vec<PathBuf> {
    let stem = only.and_then(|p| {
        let name = p.file_name()?.to_string_lossy().into_owned();
        Some(split_name(&name).0.to_owned())
    });
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let path = e.path();
            let name = path.file_name()?.to_string_lossy().into_owned();
            let (file_stem, ext) = split_name(&name);
            if ext.is_empty() {
                return None;
            }
            if let Some(stem) = &stem
                && file_stem != stem
                && !file_stem
                    .strip_prefix(stem.as_str())
                    .and_then(|r| r.strip_prefix('.'))
                    .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))
            {
                return None;
            }
            let meta = e.metadata().ok()?;
            if !meta.is_file() {
                return None;
            }
            Some((meta.modified().ok()?, meta.len(), path))
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    let mut deleted = Vec::new();
    for (modified, len, path) in files {
        if keep.contains(&path) {
            continue;
        }
        let too_old = now
            .duration_since(modified)
            .is_ok_and(|age| age > retention.max_age);
        if (too_old || total > retention.max_total_bytes) && std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
            deleted.push(path);
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_numbered_before_the_extension() {
        let first = Path::new("/r/s.jsonl.zst");
        assert_eq!(segment_path(first, 0), first);
        assert_eq!(segment_path(first, 2), Path::new("/r/s.2.jsonl.zst"));
        assert_eq!(
            segment_path(Path::new("/r/s.jsonl"), 1),
            Path::new("/r/s.1.jsonl")
        );
        assert_eq!(segment_path(Path::new("/r/s"), 3), Path::new("/r/s.3"));
        assert_eq!(
            first_segment(Path::new("/r/s.2.jsonl.zst"), 2),
            Path::new("/r/s.jsonl.zst")
        );
        assert!(is_compressed(first));
        assert!(!is_compressed(Path::new("a.jsonl")));
    }

    #[test]
    fn default_names_carry_the_utc_time_and_host() {
        assert_eq!(
            default_name(1_750_000_000_000, "gpu box/1"),
            "20250615-150640-gpu_box_1.jsonl.zst"
        );
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_stamp(951_782_400_000), "20000229-000000");
    }

    #[test]
    fn sweep_deletes_oldest_beyond_the_total_and_keeps_the_active_file() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, len: usize| {
            let p = dir.path().join(name);
            std::fs::write(&p, vec![b'x'; len]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            p
        };
        let a = mk("a.jsonl", 100);
        let b = mk("b.jsonl.zst", 100);
        let other = mk("notes.txt", 1000);
        let c = mk("c.jsonl", 100);
        let retention = Retention {
            max_total_bytes: 250,
            max_age: Duration::from_secs(3600),
        };
        let deleted = sweep(
            dir.path(),
            None,
            retention,
            std::slice::from_ref(&a),
            SystemTime::now(),
        );
        assert_eq!(deleted, vec![b.clone()]);
        assert!(a.exists() && c.exists() && other.exists());
        let later = SystemTime::now() + Duration::from_secs(7200);
        let deleted = sweep(dir.path(), None, retention, std::slice::from_ref(&c), later);
        assert_eq!(deleted, vec![a]);
        assert!(c.exists());
    }

    #[test]
    fn sweep_of_one_recording_leaves_others_alone() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["s.jsonl", "s.1.jsonl", "s.2.jsonl", "t.jsonl", "s-x.jsonl"] {
            std::fs::write(dir.path().join(name), [b'x'; 100]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        let retention = Retention {
            max_total_bytes: 150,
            max_age: Duration::from_secs(3600),
        };
        let keep = [dir.path().join("s.2.jsonl")];
        let first = dir.path().join("s.jsonl");
        let deleted = sweep(
            dir.path(),
            Some(&first),
            retention,
            &keep,
            SystemTime::now(),
        );
        assert_eq!(
            deleted,
            vec![dir.path().join("s.jsonl"), dir.path().join("s.1.jsonl")]
        );
        assert!(dir.path().join("t.jsonl").exists());
        assert!(dir.path().join("s-x.jsonl").exists());
    }
}
