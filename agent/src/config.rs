//! Configuration layering: command-line flags, then environment variables, then a TOML
//! file, then built-in defaults.
//!
//! clap resolves flags and environment variables (each option names its variable); every
//! option is optional there, and whatever is still unset is taken from the file. The file
//! is `--config PATH`, else `$DEN_CONFIG`, else `$XDG_CONFIG_HOME/den/agent.toml` (or
//! `~/.config/den/agent.toml`) when it exists. Unknown keys in the file are an error
//! that names the key, so a typo never silently falls back to a default.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

/// The config file to read: explicit path, `$DEN_CONFIG`, or the XDG default if present.
pub fn config_path(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("DEN_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let default = dirs::config_dir()?.join("den").join("agent.toml");
    default.exists().then_some(default)
}

/// Read and parse a TOML config section type. A missing explicit file is an error; no
/// file at all gives `T::default()`.
pub fn load<T: DeserializeOwned + Default>(explicit: Option<&Path>) -> Result<T, ConfigError> {
    let Some(path) = config_path(explicit) else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    parse(&path, &text)
}

/// Parse TOML text, turning serde's multi-line error into one line naming the key.
pub fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: den_protocol::text::one_line(e.message()),
    })
}

/// Parse a human duration such as `200us`, `250ms`, `3s`, `2m`, `1h` (a bare number is
/// seconds).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 10s, 2m"))?;
    let secs = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?}: use us, ms, s, m or h"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Parse a byte size such as `512MiB`, `1GiB`, `64KB`, `1.5G` or a bare number of bytes.
/// Binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`KB`, `MB`, `GB`, `TB`) units; a lone
/// `K`/`M`/`G`/`T` is binary.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 4096, 512MiB or 2GiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?}: use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
            ));
        }
    };
    let bytes = n * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("invalid size {s:?}"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        listen: Option<String>,
    }

    #[test]
    fn unknown_keys_are_named_in_one_line() {
        let err = parse::<Sample>(Path::new("a.toml"), "lisen = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lisen"), "{err}");
        assert!(!err.contains('\n'));
        let ok: Sample = parse(Path::new("a.toml"), "listen = \"x\"").unwrap();
        assert_eq!(ok.listen.as_deref(), Some("x"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("2KiB").unwrap(), 2048);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1.5k").unwrap(), 1536);
        assert_eq!(parse_bytes("3MB").unwrap(), 3_000_000);
        assert!(parse_bytes("3 parsecs").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        assert_eq!(parse_duration("200us").unwrap().as_micros(), 200);
        assert_eq!(parse_duration("0µs").unwrap().as_micros(), 0);
        assert_eq!(parse_duration("3").unwrap().as_secs(), 3);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert!(parse_duration("2 parsecs").is_err());
    }
}
