//! The router's side of catalog cards that name a GGUF file (`format = "gguf"`).
//!
//! The router routes by cached prefix, so it needs a model's token ids before any worker
//! sees a request: it reads each gguf card's file itself, at start, for the tokenizer and
//! chat template, and fills the card in from it (fingerprint `ID@KV`, KV geometry,
//! context; [`super::Card::resolve_gguf`]). A local source (`file://` or an absolute
//! directory) is read in place; any other (http(s), s3, memory) is fetched once into the
//! catalog cache (`--catalog-cache`, default `~/.cache/den/catalog`) as `SHA256.gguf` and
//! reused while it still matches. Either way the file is checked against the card's size
//! and SHA-256 first: the router never tokenizes with a file the workers would refuse.
//!
//! Any failure stops the router at start with one line naming the card and the problem.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use den_protocol::wire::{ArtifactFile, ArtifactFormat};

use super::catalog::{Card, ModelCatalog};
use crate::ingress::TextModels;
use crate::model_file::ModelFile;
use crate::router::RouterOptions;
use crate::worker::models::source::{FileCheck, Source, check_file};

/// The default catalog cache: `$XDG_CACHE_HOME/den/catalog` (or `~/.cache/...`).
pub fn default_cache() -> PathBuf {
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("den")
        .join("catalog")
}

/// Resolves every gguf card of `opts.catalog` and adds its text side to
/// `opts.text_models`. Cards already resolved are left alone.
pub async fn resolve(opts: &mut RouterOptions) -> Result<(), String> {
    if opts.catalog.cards().all(|c| c.resolved) {
        return Ok(());
    }
    let mut text: TextModels = (*opts.text_models).clone();
    let mut cards: Vec<Card> = Vec::new();
    for card in opts.catalog.cards() {
        let mut card = card.clone();
        if !card.resolved {
            let model = open(&card, &opts.catalog_cache)
                .await
                .map_err(|e| format!("catalog card {}: {e}", card.file.display()))?;
            card.resolve_gguf(&model).map_err(|e| e.to_string())?;
            tracing::info!(
                model = %card.model_id,
                fingerprint = %card.fingerprint,
                file = %model.path.display(),
                "catalog card resolved from its GGUF file"
            );
            text.add(&model);
        }
        cards.push(card);
    }
    opts.catalog = Arc::new(ModelCatalog::from_cards(cards).map_err(|e| e.to_string())?);
    opts.text_models = Arc::new(text);
    Ok(())
}

/// The card's file, checked and opened.
async fn open(card: &Card, cache: &Path) -> Result<ModelFile, String> {
    if card.format != ArtifactFormat::Gguf {
        return Err("not a gguf card".into());
    }
    let file = card
        .files
        .first()
        .ok_or("a gguf card lists exactly one file")?
        .clone();
    let source = Source::parse(&card.source)?;
    let path = match &source {
        Source::Object(url) if url.starts_with("file://") => {
            let dir = url.trim_start_matches("file://");
            let path = Path::new(dir).join(&file.path);
            verify(&path, &file).await?;
            path
        }
        _ => fetch(&source, &file, cache).await?,
    };
    let id = card.model_id.as_str().to_owned();
    tokio::task::spawn_blocking(move || ModelFile::open(&path, Some(&id)))
        .await
        .map_err(|e| format!("opening the model file stopped: {e}"))?
}

/// Size and SHA-256 of a local file against the card.
async fn verify(path: &Path, file: &ArtifactFile) -> Result<(), String> {
    let path = path.to_path_buf();
    let expected = file.clone();
    tokio::task::spawn_blocking(move || {
        check_file(&path, &expected, |_| Ok::<(), ()>(())).map_err(|e| {
            let p = path.display();
            match e {
                FileCheck::Open(e) => format!("cannot read {p}: {e}"),
                FileCheck::Read(e) => format!("reading {p} failed: {e}"),
                FileCheck::Stopped(()) => format!("reading {p} stopped"),
                FileCheck::Size(got) => {
                    format!("{p} has {got} bytes, the card says {}", expected.bytes)
                }
                FileCheck::Sha256(got) => {
                    format!("{p}: expected sha256 {}, got {got}", expected.sha256)
                }
            }
        })
    })
    .await
    .map_err(|e| format!("checking the file stopped: {e}"))?
}

/// Fetches `file` into `cache/SHA256.gguf` unless a matching copy is there.
async fn fetch(source: &Source, file: &ArtifactFile, cache: &Path) -> Result<PathBuf, String> {
    let target = cache.join(format!("{}.gguf", file.sha256));
    if verify(&target, file).await.is_ok() {
        return Ok(target);
    }
    tokio::fs::create_dir_all(cache)
        .await
        .map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let staging = cache.join(format!(".{}.{}.partial", file.sha256, std::process::id()));
    tracing::info!(file = %file.path, bytes = file.bytes, "fetching a catalog model for its tokenizer");
    let result = async {
        source.fetch_verified(file, &staging, |_| Ok(())).await?;
        tokio::fs::rename(&staging, &target)
            .await
            .map_err(|e| format!("installing {} failed: {e}", target.display()))
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&staging).await;
    }
    result.map(|()| target)
}
