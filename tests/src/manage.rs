//! Helpers for the management API's end-to-end tests: model artifacts on disk (or in a
//! bucket), catalog cards that describe them, and a client for the router's management
//! endpoints (`/state`, previews, `POST /instance`, …) that sends the router's token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use den_protocol::ids::NodeId;
use den_protocol::skulk::api::{ModelRequirements, PreviewsResponse};
use den_protocol::skulk::{DownloadProgress, Instance, InstanceId, ModelId, State};

use crate::agents::{Router, client};

/// One artifact file: its relative path and contents.
#[derive(Debug, Clone)]
pub struct ArtifactFile {
    pub path: String,
    pub bytes: Vec<u8>,
}

impl ArtifactFile {
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(&self.bytes))
    }
}

/// A small model artifact: a config file and `weights_bytes` of deterministic weights.
pub fn artifact(seed: u8, weights_bytes: usize) -> Vec<ArtifactFile> {
    let weights = (0..weights_bytes)
        .map(|i| ((i as u64 * 2_654_435_761 + u64::from(seed)) >> 7) as u8)
        .collect();
    vec![
        ArtifactFile {
            path: "config.json".into(),
            bytes: format!("{{\"seed\":{seed},\"layers\":4}}").into_bytes(),
        },
        ArtifactFile {
            path: "weights/model-00001.bin".into(),
            bytes: weights,
        },
    ]
}

/// Writes the files under `dir` (creating directories).
pub fn write_files(dir: &Path, files: &[ArtifactFile]) {
    for f in files {
        let path = f.path.split('/').fold(dir.to_path_buf(), |p, s| p.join(s));
        std::fs::create_dir_all(path.parent().expect("a file has a parent")).expect("mkdir");
        std::fs::write(&path, &f.bytes).expect("write artifact file");
    }
}

/// The path of one artifact file under `dir`.
pub fn file_in(dir: &Path, file: &ArtifactFile) -> PathBuf {
    file.path
        .split('/')
        .fold(dir.to_path_buf(), |p, s| p.join(s))
}

/// A one-card catalog written by [`local_catalog`].
pub struct LocalCatalog {
    /// The catalog directory (for `--catalog`).
    pub dir: PathBuf,
    /// Where the artifact files are.
    pub source: PathBuf,
    /// Their `file://` URL (for more cards of the same files).
    pub url: String,
}

/// A one-card catalog under `dir`: `files` written to `dir/tiny`, the card of `model`
/// serving them from there (`file://…`) at `dir/catalog/tiny.toml`.
pub fn local_catalog(
    dir: &Path,
    model: &str,
    registry_card_id: Option<&str>,
    files: &[ArtifactFile],
) -> LocalCatalog {
    let source = dir.join("tiny");
    write_files(&source, files);
    let catalog = dir.join("catalog");
    std::fs::create_dir_all(&catalog).expect("mkdir catalog");
    let url = format!("file://{}", source.display());
    std::fs::write(
        catalog.join("tiny.toml"),
        card(model, registry_card_id, &url, None, files),
    )
    .expect("write card");
    LocalCatalog {
        dir: catalog,
        source,
        url,
    }
}

/// A catalog card (TOML) for `files` at `source`: 4 layers × 2 KV heads × 32 × bf16
/// (1 KiB of KV per token), context 2048.
pub fn card(
    model_id: &str,
    registry_card_id: Option<&str>,
    source: &str,
    memory_estimate: Option<&str>,
    files: &[ArtifactFile],
) -> String {
    let mut out = format!("model_id = \"{model_id}\"\n");
    if let Some(r) = registry_card_id {
        out.push_str(&format!("registry_card_id = \"{r}\"\n"));
    }
    out.push_str(&format!(
        "family = \"test\"\nsource = \"{source}\"\ncontext_length = 2048\n"
    ));
    if let Some(m) = memory_estimate {
        out.push_str(&format!("memory_estimate = \"{m}\"\n"));
    }
    out.push_str("required_capabilities = [\"text-generation\"]\n");
    out.push_str("\n[kv]\nlayers = 4\nkv_heads = 2\nhead_dim = 32\ndtype = \"bf16\"\n");
    for f in files {
        out.push_str(&format!(
            "\n[[files]]\npath = \"{}\"\nbytes = {}\nsha256 = \"{}\"\n",
            f.path,
            f.bytes.len(),
            f.sha256()
        ));
    }
    out
}

/// Uploads `files` to `bucket/prefix` on an S3-compatible server that accepts unsigned
/// requests (moto).
pub async fn upload_s3(endpoint: &str, bucket: &str, prefix: &str, files: &[ArtifactFile]) {
    for f in files {
        let url = format!("{endpoint}/{bucket}/{prefix}/{}", f.path);
        let resp = client()
            .put(&url)
            .body(f.bytes.clone())
            .send()
            .await
            .expect("PUT to the S3 server");
        assert!(resp.status().is_success(), "PUT {url}: {}", resp.status());
    }
}

/// The management API of a router, with its token.
pub struct Mgmt<'a> {
    pub router: &'a Router,
}

/// An answer: status and JSON body (`Null` when the body is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Mgmt<'_> {
    fn req(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.router.token {
            Some(t) => builder.bearer_auth(t),
            None => builder,
        }
    }

    async fn send(&self, builder: reqwest::RequestBuilder) -> Answer {
        let resp = self.req(builder).send().await.expect("management request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    pub async fn get(&self, path_and_query: &str) -> Answer {
        self.send(client().get(format!("{}{path_and_query}", self.router.url)))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(
            client()
                .post(format!("{}{path}", self.router.url))
                .json(&body),
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(client().delete(format!("{}{path}", self.router.url)))
            .await
    }

    /// `GET /state`, parsed with den-protocol's Skulk types.
    pub async fn state(&self) -> State {
        let a = self.get("/state").await;
        assert_eq!(a.status, 200, "GET /state: {:?}", a.body);
        serde_json::from_value(a.body).expect("/state parses as den_protocol::skulk::State")
    }

    pub async fn previews(
        &self,
        model: &str,
        nodes: &[&str],
        excluded: &[&str],
    ) -> PreviewsResponse {
        let mut q = format!("/instance/previews?model_id={}", enc(model));
        for n in nodes {
            q.push_str(&format!("&node_ids={}", enc(n)));
        }
        for n in excluded {
            q.push_str(&format!("&excluded_node_ids={}", enc(n)));
        }
        let a = self.get(&q).await;
        assert_eq!(a.status, 200, "GET {q}: {:?}", a.body);
        serde_json::from_value(a.body).expect("previews parse")
    }

    pub async fn requirements(&self, model: &str, context: Option<u64>) -> Answer {
        let mut q = format!("/models/requirements?model_id={}", enc(model));
        if let Some(c) = context {
            q.push_str(&format!("&context_tokens={c}"));
        }
        self.get(&q).await
    }

    pub async fn requirements_of(&self, model: &str, context: Option<u64>) -> ModelRequirements {
        let a = self.requirements(model, context).await;
        assert_eq!(a.status, 200, "requirements: {:?}", a.body);
        serde_json::from_value(a.body).expect("requirements parse")
    }

    /// The admitted preview's instance for exactly `node`.
    pub async fn preview_on(&self, model: &str, node: &str) -> Instance {
        let p = self.previews(model, &[node], &[]).await;
        let preview = p
            .previews
            .into_iter()
            .find(|p| p.is_admitted() && p.nodes() == [NodeId::from(node)].into())
            .unwrap_or_else(|| panic!("no admitted preview of {model} on {node}"));
        preview
            .instance
            .expect("an admitted preview has an instance")
    }

    /// `POST /instance {"instance": …}`.
    pub async fn create(&self, instance: &Instance) -> Answer {
        self.post("/instance", json!({ "instance": instance }))
            .await
    }

    /// Polls `/state` until `f` returns `Some`.
    pub async fn wait_state<T>(&self, what: &str, mut f: impl FnMut(&State) -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let state = self.state().await;
            if let Some(v) = f(&state) {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after 60 s waiting for {what}; last state: {}",
                serde_json::to_string(&state).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The instance's only node and runner.
pub fn instance_ids(instance: &Instance) -> (InstanceId, den_protocol::skulk::RunnerId) {
    let core = instance.core().expect("instance core");
    let runner = core
        .shard_assignments
        .node_to_runner
        .values()
        .next()
        .expect("one runner")
        .clone();
    (core.instance_id, runner)
}

/// The download records of `model` on `node`.
pub fn downloads_of<'a>(state: &'a State, node: &str, model: &str) -> Vec<&'a DownloadProgress> {
    state
        .downloads_of(&NodeId::from(node))
        .iter()
        .filter(|d| {
            d.model_card()
                .is_some_and(|c| c.model_id == ModelId::from(model))
        })
        .collect()
}

fn enc(s: &str) -> String {
    den_protocol::skulk::http::percent_encode(s)
}
