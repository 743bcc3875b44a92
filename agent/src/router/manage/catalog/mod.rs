//! The model catalog: one TOML card per model in a directory (`den-agent router
//! --catalog DIR`). See `agent/catalog/README.md` for the format.
//!
//! A card declares the model's identity (model id, optional fingerprint and signed
//! registry card id), its KV geometry (layers, KV heads, head dim, dtype: the page pool
//! is sized from `2 × layers × kv_heads × head_dim × dtype bytes` per token), its
//! context length, the artifact files with their sizes and SHA-256, where to download
//! them from (`s3://bucket/prefix`, `file:///dir`, `memory://prefix`), an optional memory
//! estimate (absent: unknown, served as `null`, never as zero) and the capabilities an
//! engine must support.
//!
//! Loading is strict: an unknown key, a missing key or an invalid value stops the router
//! at start with one line naming the file and the key. The card digest is the SHA-256 of
//! the card's canonical JSON (every field but `source`, which is where the artifact lives,
//! not what it is): it names the installation on workers and is what previews and
//! requirements report as `card_digest`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use den_protocol::ids::ModelFingerprint;
use den_protocol::skulk::api::{ModelList, ModelListEntry, ModelRequirements};
use den_protocol::skulk::model::CardPlacement;
use den_protocol::skulk::{Memory, ModelCard, ModelId, RegistryCardId};
use den_protocol::wire::manage::{check_relative_path, is_sha256_hex};
use den_protocol::wire::{ArtifactFile, ArtifactFormat, ModelArtifact};

use crate::config::parse_bytes;
use crate::model_file::ModelFile;
use crate::worker::models::source::Source;

mod parse;

/// Backends a card is compatible with when it names none.
pub const DEFAULT_BACKENDS: &[&str] = &["host", "cuda"];

/// What den's engine (synthetic or a GGUF model) does for a card: generate text through
/// chat, completions and `/v1/generate`. Nothing else (no vision, no tool calls).
pub const DEN_ENGINE_CAPABILITIES: &[&str] = &["text", "text-generation"];

/// The loaded catalog, by model id.
#[derive(Debug, Clone, Default)]
pub struct ModelCatalog {
    cards: BTreeMap<ModelId, Card>,
}

/// A card that could not be used: one line naming the file and the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("catalog card {file}: {message}")]
pub struct CardError {
    pub file: String,
    pub message: String,
}

/// One validated card.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    pub file: PathBuf,
    pub model_id: ModelId,
    pub fingerprint: ModelFingerprint,
    pub registry_card_id: Option<RegistryCardId>,
    pub family: String,
    pub quantization: String,
    pub hidden_size: u64,
    pub tasks: Vec<String>,
    pub kv: KvGeometry,
    pub context_length: u64,
    pub files: Vec<ArtifactFile>,
    pub source: String,
    /// Whole-model memory estimate; `None` is unknown, not zero.
    pub memory_estimate: Option<u64>,
    pub backends: Vec<String>,
    pub required_capabilities: Vec<String>,
    pub format: ArtifactFormat,
    /// False for a gguf card until [`Card::resolve_gguf`] read its file (fingerprint, KV
    /// geometry, context); the router resolves every card before it serves.
    pub resolved: bool,
    pub digest: String,
}

/// The KV cache geometry of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KvGeometry {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype: KvDtype,
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    F32,
    F16,
    Bf16,
    Fp8,
    Int8,
}

impl KvDtype {
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8 | KvDtype::Int8 => 1,
        }
    }
}

impl KvGeometry {
    /// A gguf card's geometry before its file was read.
    pub const UNKNOWN: KvGeometry = KvGeometry {
        layers: 0,
        kv_heads: 0,
        head_dim: 0,
        dtype: KvDtype::F16,
    };

    /// One token's K and V over every layer: `2 × layers × kv_heads × head_dim × dtype`.
    pub fn bytes_per_token(&self) -> u64 {
        2 * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * self.dtype.bytes()
    }
}

impl ModelCatalog {
    /// Every `*.toml` card in `dir`, in file-name order. A model id or fingerprint used
    /// by two cards is an error naming both files.
    pub fn load_dir(dir: &Path) -> Result<ModelCatalog, CardError> {
        let entries = std::fs::read_dir(dir).map_err(|e| CardError {
            file: dir.display().to_string(),
            message: format!("cannot read the catalog directory: {e}"),
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        files.sort();
        let mut cards = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| CardError {
                file: file.display().to_string(),
                message: format!("cannot read it: {e}"),
            })?;
            cards.push(Card::parse(&file, &text)?);
        }
        ModelCatalog::from_cards(cards)
    }

    /// A catalog of already parsed cards (tests, tools).
    pub fn from_cards(cards: Vec<Card>) -> Result<ModelCatalog, CardError> {
        let mut by_id: BTreeMap<ModelId, Card> = BTreeMap::new();
        let mut fingerprints: BTreeMap<ModelFingerprint, PathBuf> = BTreeMap::new();
        for card in cards {
            if let Some(other) = by_id.get(&card.model_id) {
                return Err(CardError {
                    file: card.file.display().to_string(),
                    message: format!(
                        "key `model_id`: {} is also declared by {}",
                        card.model_id,
                        other.file.display()
                    ),
                });
            }
            if let Some(other) = fingerprints.insert(card.fingerprint.clone(), card.file.clone()) {
                return Err(CardError {
                    file: card.file.display().to_string(),
                    message: format!(
                        "key `fingerprint`: {} is also used by {}",
                        card.fingerprint,
                        other.display()
                    ),
                });
            }
            by_id.insert(card.model_id.clone(), card);
        }
        Ok(ModelCatalog { cards: by_id })
    }

    pub fn get(&self, model: &ModelId) -> Option<&Card> {
        self.cards.get(model)
    }

    pub fn by_digest(&self, digest: &str) -> Option<&Card> {
        self.cards.values().find(|c| c.digest == digest)
    }

    pub fn by_fingerprint(&self, fingerprint: &ModelFingerprint) -> Option<&Card> {
        self.cards.values().find(|c| &c.fingerprint == fingerprint)
    }

    pub fn cards(&self) -> impl Iterator<Item = &Card> {
        self.cards.values()
    }

    pub fn len(&self) -> usize {
        self.cards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cards.is_empty()
    }

    /// Model ids, for error messages.
    pub fn ids(&self) -> String {
        if self.cards.is_empty() {
            return "none (start the router with --catalog DIR)".to_owned();
        }
        self.cards
            .keys()
            .map(ModelId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `GET /models`: the catalog in Skulk's model-list shape.
    pub fn model_list(&self) -> ModelList {
        ModelList {
            object: "list".to_owned(),
            data: self.cards.values().map(Card::list_entry).collect(),
            extra: Default::default(),
        }
    }
}

impl Card {
    /// Fills a gguf card in from its opened file: the fingerprint `ID@KV` (the weights
    /// and row layout), the KV geometry (f16 rows) and the context (the file's, or the
    /// card's `context_length` when that is smaller); the digest is recomputed over them.
    pub fn resolve_gguf(&mut self, model: &ModelFile) -> Result<(), CardError> {
        let err = |message: String| CardError {
            file: self.file.display().to_string(),
            message,
        };
        if self.format != ArtifactFormat::Gguf {
            return Err(err("not a gguf card".into()));
        }
        let trained = u64::from(model.text.context_length);
        if self.context_length != u64::MAX && self.context_length > trained {
            return Err(err(format!(
                "key `context_length`: {} is more than the model's trained context of {trained} positions",
                self.context_length
            )));
        }
        self.context_length = self.context_length.min(trained);
        self.fingerprint = model.fingerprint().clone();
        self.kv = KvGeometry {
            layers: model.layout.layers,
            kv_heads: model.layout.kv_heads,
            head_dim: model.layout.head_dim,
            dtype: KvDtype::F16,
        };
        self.resolved = true;
        self.digest = self.compute_digest();
        Ok(())
    }

    /// Bytes of every artifact file.
    pub fn storage_bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |sum, f| sum.saturating_add(f.bytes))
    }

    /// What a worker needs to download, verify and load it.
    pub fn artifact(&self) -> ModelArtifact {
        ModelArtifact {
            model_id: self.model_id.clone(),
            fingerprint: self.fingerprint.clone(),
            card_digest: self.digest.clone(),
            registry_card_id: self.registry_card_id.clone(),
            layers: self.kv.layers,
            kv_bytes_per_token: self.kv.bytes_per_token(),
            context_length: self.context_length,
            files: self.files.clone(),
            format: self.format,
        }
    }

    /// The Skulk-shaped card embedded in shard metadata (camelCase). den's own facts
    /// (digest, KV geometry) ride along as extra fields.
    pub fn model_card(&self) -> ModelCard {
        let mut card = ModelCard::minimal(self.model_id.clone());
        card.storage_size = Memory::from_bytes(self.storage_bytes());
        card.n_layers = u64::from(self.kv.layers);
        card.hidden_size = self.hidden_size;
        card.num_key_value_heads = Some(u64::from(self.kv.kv_heads));
        card.tasks = self.tasks.clone();
        card.family = self.family.clone();
        card.quantization = self.quantization.clone();
        card.capabilities = self.required_capabilities.clone();
        card.context_length = self.context_length;
        card.placement = Some(CardPlacement {
            compatible_backends: self.backends.clone(),
            min_vram_gib: None,
            max_context_tokens: Some(self.context_length),
            backend_preference: Vec::new(),
            extra: Default::default(),
        });
        card.registry_card_id = self.registry_card_id.clone();
        card.extra
            .insert("cardDigest".to_owned(), json!(self.digest.clone()));
        card.extra.insert(
            "kvGeometry".to_owned(),
            json!({
                "layers": self.kv.layers,
                "kvHeads": self.kv.kv_heads,
                "headDim": self.kv.head_dim,
                "dtype": self.kv.dtype,
                "bytesPerToken": self.kv.bytes_per_token(),
            }),
        );
        card
    }

    /// `GET /models/requirements`: advisory, reserves nothing. The memory estimate is
    /// the card's declared whole-model estimate plus the KV cache of `context_tokens`
    /// (one sequence); `null` when the card declares none.
    pub fn requirements(&self, context_tokens: Option<u64>) -> ModelRequirements {
        let kv = self
            .kv
            .bytes_per_token()
            .saturating_mul(context_tokens.unwrap_or(0));
        ModelRequirements {
            model_id: self.model_id.clone(),
            card_digest: Some(self.digest.clone()),
            registry_card_id: self.registry_card_id.clone(),
            context_tokens,
            context_limit: Some(self.context_length),
            storage_bytes: Some(self.storage_bytes()),
            estimated_memory_bytes: self.memory_estimate.map(|m| m.saturating_add(kv)),
            discrete_gpu_memory_fraction: None,
            unified_memory_fraction: None,
            compatible_backends: self.backends.clone(),
            required_capabilities: self.required_capabilities.clone(),
            engine_support: self.engine_claims(),
            incomplete_capabilities: Vec::new(),
            estimate_only: true,
            extra: [(
                "kv_bytes_per_token".to_owned(),
                json!(self.kv.bytes_per_token()),
            )]
            .into_iter()
            .collect(),
        }
    }

    /// den's own engine claims for this card: one per required capability den's engine
    /// implements, on every backend the card lists. A capability den does not implement
    /// gets no claim, so a controller reading these (den place) refuses the placement.
    fn engine_claims(&self) -> Vec<serde_json::Value> {
        self.required_capabilities
            .iter()
            .filter(|c| DEN_ENGINE_CAPABILITIES.contains(&c.as_str()))
            .flat_map(|c| {
                self.backends.iter().map(move |backend| {
                    json!({
                        "capability": c,
                        "engine": "den",
                        "build": env!("CARGO_PKG_VERSION"),
                        "hardware": backend,
                        "status": "supported",
                    })
                })
            })
            .collect()
    }

    fn list_entry(&self) -> ModelListEntry {
        ModelListEntry {
            id: self.model_id.clone(),
            object: "model".to_owned(),
            created: 0,
            owned_by: "den".to_owned(),
            hugging_face_id: String::new(),
            name: self.model_id.to_string(),
            description: String::new(),
            context_length: self.context_length,
            tags: Vec::new(),
            storage_size_megabytes: self.storage_bytes() / (1024 * 1024),
            supports_tensor: false,
            tasks: self.tasks.clone(),
            is_custom: false,
            family: self.family.clone(),
            quantization: self.quantization.clone(),
            base_model: String::new(),
            capabilities: self.required_capabilities.clone(),
            reasoning: None,
            modalities: None,
            tooling: None,
            runtime: None,
            resolved_capabilities: None,
            registry_card_id: self.registry_card_id.clone(),
            extra: [("card_digest".to_owned(), json!(self.digest.clone()))]
                .into_iter()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: &str = r#"
model_id = "den/tiny"
registry_card_id = "den-registry:tiny:v1"
family = "tiny"
source = "file:///var/lib/den/artifacts/tiny"
context_length = 2048
required_capabilities = ["text-generation"]

[kv]
layers = 4
kv_heads = 2
head_dim = 64
dtype = "bf16"

[[files]]
path = "weights.bin"
bytes = 1024
sha256 = "ab5c1a8f0b6d2b7a1c8d4e5f60718293a4b5c6d7e8f90112233445566778899a"
"#;

    fn parse(text: &str) -> Result<Card, CardError> {
        Card::parse(Path::new("tiny.toml"), text)
    }

    #[test]
    fn a_card_gives_geometry_digest_and_an_unknown_estimate() {
        let card = parse(CARD).unwrap();
        assert_eq!(card.kv.bytes_per_token(), 2 * 4 * 2 * 64 * 2);
        assert_eq!(card.digest.len(), 64);
        assert_eq!(card.fingerprint.as_str(), "den/tiny");
        let r = card.requirements(Some(100));
        assert_eq!(
            r.memory_estimate(),
            den_protocol::skulk::MemoryEstimate::Unknown
        );
        assert_eq!(r.card_digest.as_deref(), Some(card.digest.as_str()));
        let with = parse(&CARD.replace(
            "context_length",
            "memory_estimate = \"1MiB\"\ncontext_length",
        ))
        .unwrap();
        assert_eq!(
            with.requirements(Some(10)).estimated_memory_bytes,
            Some((1 << 20) + 10 * with.kv.bytes_per_token())
        );
        assert_ne!(with.digest, card.digest, "the estimate is part of the card");
        // The source is where, not what: it does not change the digest.
        let moved =
            parse(&CARD.replace("file:///var/lib/den/artifacts/tiny", "s3://bucket/tiny")).unwrap();
        assert_eq!(moved.digest, card.digest);
        let mc = card.model_card();
        assert_eq!(
            mc.registry_card_id.as_ref().map(|r| r.as_str()),
            Some("den-registry:tiny:v1")
        );
        assert_eq!(mc.storage_size.in_bytes, 1024);
        assert_eq!(card.artifact().validate(), Ok(()));
    }

    #[test]
    fn invalid_cards_name_the_file_and_the_key() {
        let e = parse(&CARD.replace("layers = 4", "layers = 0")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "catalog card tiny.toml: key `kv.layers`: must be > 0"
        );
        let e = parse(&CARD.replace("family", "famly"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("famly") && e.contains("tiny.toml") && !e.contains('\n'),
            "{e}"
        );
        let e = parse(&CARD.replace("path = \"weights.bin\"", "path = \"../x\"")).unwrap_err();
        assert!(e.to_string().contains("files[0].path"), "{e}");
        let e = parse(&CARD.replace("ab5c", "zz5c")).unwrap_err();
        assert!(e.to_string().contains("files[0].sha256"), "{e}");
        let e = parse(&CARD.replace("file:///var", "ftp://var")).unwrap_err();
        assert!(e.to_string().contains("key `source`"), "{e}");
        let e = parse(&CARD.replace("dtype = \"bf16\"", "dtype = \"f13\"")).unwrap_err();
        assert!(e.to_string().contains("f13"), "{e}");
        let e = parse(&CARD.replace("context_length = 2048\n", "")).unwrap_err();
        assert!(e.to_string().contains("context_length"), "{e}");
    }

    const GGUF_CARD: &str = r#"
model_id = "smol"
format = "gguf"
source = "https://models.example/smol"

[[files]]
path = "smol.gguf"
bytes = 1024
sha256 = "ab5c1a8f0b6d2b7a1c8d4e5f60718293a4b5c6d7e8f90112233445566778899a"
"#;

    #[test]
    fn a_gguf_card_waits_for_its_file_and_may_not_restate_it() {
        let card = parse(GGUF_CARD).unwrap();
        assert_eq!(card.format, ArtifactFormat::Gguf);
        assert!(!card.resolved, "resolved only from the file");
        assert_eq!(card.artifact().format, ArtifactFormat::Gguf);
        let opaque = parse(CARD).unwrap();
        assert!(opaque.resolved);
        let with_kv =
            format!("{GGUF_CARD}\n[kv]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\ndtype = \"f16\"\n");
        let e = parse(&with_kv).unwrap_err().to_string();
        assert!(e.contains("key `kv`") && e.contains("from the file"), "{e}");
        let e = parse(&GGUF_CARD.replace(
            "model_id = \"smol\"",
            "model_id = \"smol\"\nfingerprint = \"x\"",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("key `fingerprint`"), "{e}");
        let e = parse(&GGUF_CARD.replace("smol.gguf", "smol.bin"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `files`") && e.contains(".gguf"), "{e}");
        let e = parse(&GGUF_CARD.replace("\"gguf\"", "\"onnx\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `format`") && e.contains("onnx"), "{e}");
        // An opaque card still needs its geometry.
        let e = parse(&CARD.replace("[kv]", "[kv_]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("kv"), "{e}");
        // Sources: absolute directories and http(s) bases too.
        assert!(parse(&CARD.replace("file:///var", "/var")).is_ok());
        assert!(
            parse(&CARD.replace(
                "file:///var/lib/den/artifacts/tiny",
                "http://127.0.0.1:8000/tiny"
            ))
            .is_ok()
        );
    }

    /// den claims only what its engine does: a card that requires text generation is
    /// proven on each of its backends; one that also requires vision is not, so den
    /// place refuses it before anything is sent.
    #[test]
    fn engine_claims_prove_only_what_den_implements() {
        use den_protocol::placement::capability::unproven_capabilities;
        let card = parse(CARD).unwrap();
        let r = card.requirements(None);
        assert_eq!(r.required_capabilities, ["text-generation"]);
        assert_eq!(r.engine_support.len(), card.backends.len());
        assert!(unproven_capabilities(&r).is_empty());
        let vision = parse(&CARD.replace(
            "required_capabilities = [\"text-generation\"]",
            "required_capabilities = [\"text-generation\", \"vision\"]",
        ))
        .unwrap();
        assert_eq!(
            unproven_capabilities(&vision.requirements(None)),
            ["vision"]
        );
    }

    #[test]
    fn the_example_catalog_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog");
        let catalog = ModelCatalog::load_dir(&dir).unwrap();
        let card = catalog.get(&ModelId::from("den/tiny-chat")).unwrap();
        assert_eq!(card.kv.bytes_per_token(), 16 * 1024);
        assert_eq!(card.storage_bytes(), 48 + 8 * 1024 * 1024);
    }

    #[test]
    fn duplicate_models_are_refused() {
        let a = parse(CARD).unwrap();
        let mut b = a.clone();
        b.file = PathBuf::from("other.toml");
        let e = ModelCatalog::from_cards(vec![a, b])
            .unwrap_err()
            .to_string();
        assert!(e.contains("other.toml") && e.contains("tiny.toml"), "{e}");
    }
}
