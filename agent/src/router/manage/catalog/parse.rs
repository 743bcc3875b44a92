//! Reading a card: the strict TOML form (an unknown, missing or invalid key is an error
//! naming the file and the key) into a [`Card`], and the card digest over its canonical
//! JSON.

use super::*;

/// The TOML form of a card.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCard {
    model_id: String,
    #[serde(default)]
    fingerprint: Option<String>,
    #[serde(default)]
    registry_card_id: Option<String>,
    #[serde(default)]
    family: String,
    #[serde(default)]
    quantization: String,
    #[serde(default)]
    hidden_size: u64,
    #[serde(default)]
    tasks: Option<Vec<String>>,
    source: String,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    context_length: Option<u64>,
    #[serde(default)]
    memory_estimate: Option<RawSize>,
    #[serde(default)]
    backends: Option<Vec<String>>,
    #[serde(default)]
    required_capabilities: Vec<String>,
    #[serde(default)]
    kv: Option<RawKv>,
    files: Vec<RawFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKv {
    layers: u32,
    kv_heads: u32,
    head_dim: u32,
    dtype: KvDtype,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    bytes: u64,
    sha256: String,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

/// What the digest covers (everything but the source), in a fixed order.
#[derive(Serialize)]
struct Canonical<'a> {
    model_id: &'a str,
    fingerprint: &'a str,
    registry_card_id: Option<&'a str>,
    family: &'a str,
    quantization: &'a str,
    hidden_size: u64,
    tasks: &'a [String],
    kv: &'a KvGeometry,
    context_length: u64,
    files: &'a [ArtifactFile],
    memory_estimate: Option<u64>,
    backends: &'a [String],
    required_capabilities: &'a [String],
    #[serde(skip_serializing_if = "ArtifactFormat::is_opaque")]
    format: ArtifactFormat,
}

impl Card {
    /// Parses and validates one card; `file` names it in errors.
    pub fn parse(file: &Path, text: &str) -> Result<Card, CardError> {
        let err = |message: String| CardError {
            file: file.display().to_string(),
            message,
        };
        let raw: RawCard = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| format!(" (line {})", line_of(text, s.start)))
                .unwrap_or_default();
            err(format!(
                "{}{line}",
                den_protocol::text::one_line(e.message())
            ))
        })?;
        let key = |k: &str, why: String| err(format!("key `{k}`: {why}"));
        let model_id = raw.model_id.trim().to_owned();
        if model_id.is_empty() {
            return Err(key("model_id", "must not be empty".into()));
        }
        let format = match raw.format.as_deref().map(str::trim) {
            None | Some("opaque") => ArtifactFormat::Opaque,
            Some("gguf") => ArtifactFormat::Gguf,
            Some(other) => {
                return Err(key(
                    "format",
                    format!("unknown format {other:?}: use gguf (a model den runs) or opaque"),
                ));
            }
        };
        let gguf = format == ArtifactFormat::Gguf;
        if gguf {
            // The file is the truth for these: a card that restated them could contradict it.
            for (k, given) in [
                ("fingerprint", raw.fingerprint.is_some()),
                ("kv", raw.kv.is_some()),
            ] {
                if given {
                    return Err(key(
                        k,
                        "a gguf card takes it from the file (the router computes it at start): remove it".into(),
                    ));
                }
            }
            if raw.files.len() != 1 || raw.files.iter().any(|f| !f.path.ends_with(".gguf")) {
                return Err(key(
                    "files",
                    "a gguf card lists exactly one file, whose name ends in .gguf".into(),
                ));
            }
        }
        let fingerprint = raw
            .fingerprint
            .map(|f| f.trim().to_owned())
            .unwrap_or_else(|| model_id.clone());
        if fingerprint.is_empty() {
            return Err(key("fingerprint", "must not be empty".into()));
        }
        let registry_card_id = match raw.registry_card_id.map(|r| r.trim().to_owned()) {
            Some(r) if r.is_empty() => {
                return Err(key(
                    "registry_card_id",
                    "must not be empty when given".into(),
                ));
            }
            other => other,
        };
        let kv = match raw.kv {
            Some(kv) => {
                for (name, v) in [
                    ("kv.layers", kv.layers),
                    ("kv.kv_heads", kv.kv_heads),
                    ("kv.head_dim", kv.head_dim),
                ] {
                    if v == 0 {
                        return Err(key(name, "must be > 0".into()));
                    }
                }
                KvGeometry {
                    layers: kv.layers,
                    kv_heads: kv.kv_heads,
                    head_dim: kv.head_dim,
                    dtype: kv.dtype,
                }
            }
            // Filled in from the file by `resolve_gguf`.
            None if gguf => KvGeometry::UNKNOWN,
            None => {
                return Err(key(
                    "kv",
                    "missing: layers, kv_heads, head_dim, dtype".into(),
                ));
            }
        };
        let context_length = match raw.context_length {
            Some(0) => return Err(key("context_length", "must be > 0".into())),
            Some(n) => n,
            // The file's (`resolve_gguf`).
            None if gguf => u64::MAX,
            None => return Err(key("context_length", "missing".into())),
        };
        Source::parse(&raw.source).map_err(|e| key("source", e))?;
        if raw.files.is_empty() {
            return Err(key(
                "files",
                "a card lists at least one artifact file".into(),
            ));
        }
        let mut files = Vec::with_capacity(raw.files.len());
        for (i, f) in raw.files.into_iter().enumerate() {
            let at = |k: &str| format!("files[{i}].{k}");
            check_relative_path(&f.path)
                .map_err(|why| key(&at("path"), format!("{:?} {why}", f.path)))?;
            if files.iter().any(|g: &ArtifactFile| g.path == f.path) {
                return Err(key(&at("path"), format!("{:?} is listed twice", f.path)));
            }
            let sha256 = f.sha256.trim().to_ascii_lowercase();
            if !is_sha256_hex(&sha256) {
                return Err(key(
                    &at("sha256"),
                    "must be 64 hex digits (sha256sum FILE)".into(),
                ));
            }
            files.push(ArtifactFile {
                path: f.path,
                bytes: f.bytes,
                sha256,
            });
        }
        let memory_estimate = match raw.memory_estimate {
            None => None,
            Some(RawSize::Bytes(n)) => Some(n),
            Some(RawSize::Text(t)) => Some(parse_bytes(&t).map_err(|e| key("memory_estimate", e))?),
        };
        let backends = raw
            .backends
            .unwrap_or_else(|| DEFAULT_BACKENDS.iter().map(|s| (*s).to_owned()).collect());
        if backends.is_empty() {
            return Err(key(
                "backends",
                "names at least one of host, cuda (or leave it out for both)".into(),
            ));
        }
        if let Some(b) = backends
            .iter()
            .find(|b| !DEFAULT_BACKENDS.contains(&b.as_str()))
        {
            return Err(key(
                "backends",
                format!("unknown backend {b:?}: use host or cuda"),
            ));
        }
        let tasks = raw
            .tasks
            .unwrap_or_else(|| vec!["TextGeneration".to_owned()]);
        let mut card = Card {
            file: file.to_path_buf(),
            model_id: ModelId::new(model_id),
            fingerprint: ModelFingerprint::new(fingerprint),
            registry_card_id: registry_card_id.map(RegistryCardId::new),
            family: raw.family,
            quantization: raw.quantization,
            hidden_size: raw.hidden_size,
            tasks,
            kv,
            context_length,
            files,
            source: raw.source.trim().to_owned(),
            memory_estimate,
            backends,
            required_capabilities: raw.required_capabilities,
            format,
            resolved: !gguf,
            digest: String::new(),
        };
        card.digest = card.compute_digest();
        Ok(card)
    }

    pub(super) fn compute_digest(&self) -> String {
        let canonical = Canonical {
            model_id: self.model_id.as_str(),
            fingerprint: self.fingerprint.as_str(),
            registry_card_id: self.registry_card_id.as_ref().map(RegistryCardId::as_str),
            family: &self.family,
            quantization: &self.quantization,
            hidden_size: self.hidden_size,
            tasks: &self.tasks,
            kv: &self.kv,
            context_length: self.context_length,
            files: &self.files,
            memory_estimate: self.memory_estimate,
            backends: &self.backends,
            required_capabilities: &self.required_capabilities,
            format: self.format,
        };
        // Serialising plain structs of strings and integers cannot fail.
        let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
        hex::encode(Sha256::digest(&bytes))
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |before| before.matches('\n').count() + 1)
}
