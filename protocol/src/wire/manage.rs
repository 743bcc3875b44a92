//! Management frames: the router asks one worker to place or remove one runner of a
//! model instance (den's management API: `POST /instance`, `DELETE /instance/{id}`).
//!
//! | type | direction | payload |
//! |---|---|---|
//! | `place-runner` | router → worker | `to`, instance id, runner id, the artifact to serve, its source URL |
//! | `remove-runner` | router → worker | `to`, instance id, runner id |
//!
//! The worker answers through its heartbeat: the observation lists its download attempts
//! and runners ([`crate::observation::DownloadReport`],
//! [`crate::observation::RunnerReport`]). Both frames are idempotent: placing a runner the
//! worker already has, or removing one it does not have, changes nothing.
//!
//! Validation (done by the codec, so a worker never acts on a malformed placement): ids
//! are non-empty; the artifact has at least one file, every file path is relative with no
//! `.`/`..`/empty segments and appears once; digests are 64 lowercase hex digits; layers,
//! KV bytes per token and the context length are positive.

use serde::{Deserialize, Serialize};

use crate::ids::ModelFingerprint;
use crate::skulk::{InstanceId, ModelId, RegistryCardId, RunnerId};

/// One file of a model artifact, as the catalog card declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactFile {
    /// Relative to the artifact's source and installation directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the file's contents.
    pub sha256: String,
}

/// What an artifact's files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactFormat {
    /// Bytes the synthetic engine holds but does not compute with (its stand-in weights).
    #[default]
    Opaque,
    /// One GGUF file the runner loads and runs for real.
    Gguf,
}

impl ArtifactFormat {
    pub fn is_opaque(&self) -> bool {
        *self == ArtifactFormat::Opaque
    }
}

/// What a runner serves: the identity of the card, the KV geometry the page pool is
/// sized from, and the files to download and verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelArtifact {
    pub model_id: ModelId,
    /// What the worker advertises once the runner is ready (KV compatibility identity).
    pub fingerprint: ModelFingerprint,
    /// SHA-256 of the canonical card: names the installation.
    pub card_digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_card_id: Option<RegistryCardId>,
    pub layers: u32,
    /// `2 × layers × kv_heads × head_dim × dtype bytes`: one token's K and V.
    pub kv_bytes_per_token: u64,
    /// The card's context length (the runner never admits more).
    pub context_length: u64,
    pub files: Vec<ArtifactFile>,
    /// Absent on the wire for opaque artifacts (what workers before it understood).
    #[serde(default, skip_serializing_if = "ArtifactFormat::is_opaque")]
    pub format: ArtifactFormat,
}

impl ModelArtifact {
    /// The GGUF file of a `gguf` artifact.
    pub fn gguf_file(&self) -> Option<&ArtifactFile> {
        match self.format {
            ArtifactFormat::Gguf => self.files.first(),
            ArtifactFormat::Opaque => None,
        }
    }

    /// Bytes of every file together.
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |sum, f| sum.saturating_add(f.bytes))
    }

    /// Checks the rules in the module documentation; the error names the field.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, detail: &str| Err((field.to_owned(), detail.to_owned()));
        if self.model_id.as_str().is_empty() {
            return bad("artifact.model_id", "must not be empty");
        }
        if self.fingerprint.as_str().is_empty() {
            return bad("artifact.fingerprint", "must not be empty");
        }
        if !is_sha256_hex(&self.card_digest) {
            return bad("artifact.card_digest", "must be 64 lowercase hex digits");
        }
        if self.layers == 0 {
            return bad("artifact.layers", "must be > 0");
        }
        if self.kv_bytes_per_token == 0 {
            return bad("artifact.kv_bytes_per_token", "must be > 0");
        }
        if self.context_length == 0 {
            return bad("artifact.context_length", "must be > 0");
        }
        if self.files.is_empty() {
            return bad("artifact.files", "an artifact has at least one file");
        }
        if self.format == ArtifactFormat::Gguf
            && (self.files.len() != 1 || self.files.iter().any(|f| !f.path.ends_with(".gguf")))
        {
            return bad(
                "artifact.files",
                "a gguf artifact is exactly one file whose name ends in .gguf",
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for f in &self.files {
            if let Err(why) = check_relative_path(&f.path) {
                return Err((
                    "artifact.files.path".to_owned(),
                    format!("{:?}: {why}", f.path),
                ));
            }
            if !seen.insert(f.path.as_str()) {
                return Err((
                    "artifact.files.path".to_owned(),
                    format!("{:?} is listed twice", f.path),
                ));
            }
            if !is_sha256_hex(&f.sha256) {
                return Err((
                    "artifact.files.sha256".to_owned(),
                    format!("{:?}: must be 64 lowercase hex digits", f.path),
                ));
            }
        }
        Ok(())
    }
}

/// "Serve `artifact` as runner `runner_id` of instance `instance_id`": download it from
/// `source` unless it is installed, load it, size the page pool, report ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceRunner {
    pub instance_id: InstanceId,
    pub runner_id: RunnerId,
    pub artifact: ModelArtifact,
    /// `s3://bucket/prefix`, `file:///dir` or `memory://prefix`; file paths are relative
    /// to it.
    pub source: String,
}

/// "Tear runner `runner_id` down and release its memory." Installed artifacts stay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRunner {
    pub instance_id: InstanceId,
    pub runner_id: RunnerId,
}

/// 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A relative, `/`-separated path without empty, `.` or `..` segments or backslashes.
pub fn check_relative_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("must not be empty");
    }
    if path.starts_with('/') {
        return Err("must be relative");
    }
    if path.contains('\\') || path.contains('\0') {
        return Err("must not contain backslashes or NUL");
    }
    if path
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err("must not contain empty, . or .. segments");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact() -> ModelArtifact {
        ModelArtifact {
            model_id: "den/tiny".into(),
            fingerprint: "den/tiny".into(),
            card_digest: "a".repeat(64),
            registry_card_id: None,
            layers: 4,
            kv_bytes_per_token: 1024,
            context_length: 2048,
            files: vec![ArtifactFile {
                path: "weights/part-0.bin".into(),
                bytes: 10,
                sha256: "0".repeat(64),
            }],
            format: ArtifactFormat::Opaque,
        }
    }

    #[test]
    fn valid_artifacts_pass_and_bad_fields_are_named() {
        assert_eq!(artifact().validate(), Ok(()));
        assert_eq!(artifact().total_bytes(), 10);
        let mut a = artifact();
        a.files[0].path = "../etc/passwd".into();
        assert_eq!(a.validate().unwrap_err().0, "artifact.files.path");
        let mut a = artifact();
        a.files.push(a.files[0].clone());
        assert!(a.validate().unwrap_err().1.contains("twice"));
        let mut a = artifact();
        a.files[0].sha256 = "ABC".into();
        assert_eq!(a.validate().unwrap_err().0, "artifact.files.sha256");
        let mut a = artifact();
        a.kv_bytes_per_token = 0;
        assert_eq!(a.validate().unwrap_err().0, "artifact.kv_bytes_per_token");
        let mut a = artifact();
        a.files.clear();
        assert_eq!(a.validate().unwrap_err().0, "artifact.files");
    }

    #[test]
    fn a_gguf_artifact_is_one_gguf_file_and_opaque_stays_off_the_wire() {
        let mut a = artifact();
        a.format = ArtifactFormat::Gguf;
        assert_eq!(a.validate().unwrap_err().0, "artifact.files");
        a.files[0].path = "m/model.gguf".into();
        assert_eq!(a.validate(), Ok(()));
        assert_eq!(a.gguf_file().map(|f| f.path.as_str()), Some("m/model.gguf"));
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["format"], "gguf");
        let opaque = serde_json::to_value(artifact()).unwrap();
        assert!(opaque.get("format").is_none(), "{opaque}");
        let back: ModelArtifact = serde_json::from_value(opaque).unwrap();
        assert_eq!(back.format, ArtifactFormat::Opaque);
    }

    #[test]
    fn relative_paths_only() {
        for bad in ["", "/abs", "a//b", "./a", "a/..", "a\\b"] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "a/b.bin", "dir.d/file-1"] {
            assert!(check_relative_path(good).is_ok(), "{good:?}");
        }
    }
}
