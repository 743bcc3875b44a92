//! A real model from a GGUF file, as the worker serves it and the router tokenizes for it.
//!
//! [`ModelFile::open`] maps the file (weights stay in the map, never copied), checks every
//! tensor the architecture needs ([`den_model::Model::load`]), builds the tokenizer and chat
//! template from the file's own metadata, and names the model by its fingerprint
//! `ID@KV` ([`ModelFingerprint::of_weights`]): the public id and the first 16 hex digits of
//! the KV fingerprint, which covers the weights' digest, the KV dtype and the row layout.
//! Opening hashes every tensor (about a second per GB): the router and every worker compute
//! the same fingerprint from the same bytes, and a file with other weights gets another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use den_model::gguf::GgufFile;
use den_model::kv::KvLayout;
use den_model::sample::{GenerationConfig, SamplerConfig};
use den_model::template::ChatTemplate;
use den_model::tokenizer::Tokenizer;
use den_model::{Model, RunnerOptions};
use den_protocol::ids::{ModelFingerprint, RequestId};
use den_protocol::request::Sampling;

/// The text side of a real model: what turns requests into token ids and ids into text.
#[derive(Debug)]
pub struct ModelText {
    pub fingerprint: ModelFingerprint,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Positions the model was trained for (`*.context_length`).
    pub context_length: u32,
}

/// A GGUF model opened and checked.
#[derive(Debug, Clone)]
pub struct ModelFile {
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    pub layout: KvLayout,
    pub text: Arc<ModelText>,
}

impl ModelFile {
    /// Opens `path` and checks that den can run it; `id` is the public model id (default:
    /// the file name without `.gguf`). One-line errors name the file and the problem.
    pub fn open(path: &Path, id: Option<&str>) -> Result<ModelFile, String> {
        let file = GgufFile::open(path).map_err(|e| e.to_string())?;
        let model = Model::load(&file).map_err(|e| e.to_string())?;
        let layout = model.kv_layout();
        let context_length = model.config().context_length;
        let kv = model.fingerprint();
        drop(model);
        let tokenizer = Tokenizer::from_gguf(&file)
            .map_err(|e| format!("{}: tokenizer: {e}", path.display()))?;
        let template = ChatTemplate::from_gguf(&file, &tokenizer)
            .map_err(|e| format!("{}: chat template: {e}", path.display()))?;
        let id = match id {
            Some(id) if !id.trim().is_empty() => id.trim().to_owned(),
            _ => default_id(path),
        };
        Ok(ModelFile {
            path: path.to_path_buf(),
            file: Arc::new(file),
            layout,
            text: Arc::new(ModelText {
                fingerprint: ModelFingerprint::of_weights(&id, &kv),
                tokenizer,
                template,
                context_length,
            }),
        })
    }

    pub fn fingerprint(&self) -> &ModelFingerprint {
        &self.text.fingerprint
    }

    /// Bytes of one token's KV row in den's pages.
    pub fn row_bytes(&self) -> u64 {
        self.layout.row_bytes() as u64
    }
}

/// `PATH`'s file name without `.gguf`.
fn default_id(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.strip_suffix(".gguf").unwrap_or(n).to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "model".to_owned())
}

/// The forward pass's threads: `threads`, or every core this process may use (a worker
/// serves one model at a time on its device thread).
pub fn runner_options(threads: Option<usize>) -> RunnerOptions {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = threads.filter(|n| *n > 0).unwrap_or(cores);
    RunnerOptions {
        threads,
        ..RunnerOptions::default()
    }
}

/// What a request's sampling fields ask of den-model's generation loop. The worker samples
/// with it; the ingress replays the same stops over the tokens it receives, so both end
/// the text at the same place. Without a seed, the seed is derived from the request id:
/// a request resubmitted under its id (a retry, a replay) samples the same tokens.
pub fn generation_config(sampling: &Sampling, id: &RequestId, max_tokens: u32) -> GenerationConfig {
    GenerationConfig {
        sampler: SamplerConfig {
            temperature: sampling.temperature.unwrap_or(1.0) as f32,
            top_k: sampling.top_k.map_or(0, |k| k as usize),
            top_p: sampling.top_p.unwrap_or(1.0) as f32,
            min_p: 0.0,
            seed: sampling.seed.unwrap_or_else(|| seed_of(id)),
        },
        max_tokens: Some(max_tokens.max(1) as usize),
        stop: sampling.stop.clone(),
        stop_token_ids: sampling.stop_token_ids.clone(),
        ignore_eos: sampling.ignore_eos,
        skip_special: true,
    }
}

fn seed_of(id: &RequestId) -> u64 {
    let d = Sha256::digest(id.as_str().as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_id_is_the_file_stem() {
        assert_eq!(
            default_id(Path::new("/m/SmolLM2-135M-Instruct-Q4_1.gguf")),
            "SmolLM2-135M-Instruct-Q4_1"
        );
        assert_eq!(default_id(Path::new("/m/x")), "x");
    }

    #[test]
    fn a_file_that_is_not_a_model_is_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("broken.gguf");
        std::fs::write(&p, b"GGUF\x03\x00\x00\x00 truncated").unwrap();
        let e = ModelFile::open(&p, None).unwrap_err();
        assert!(e.contains("broken.gguf"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
