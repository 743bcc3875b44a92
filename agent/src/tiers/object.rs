//! The `object` tier: chunks as objects in any object_store backend.
//!
//! Object names: `<prefix>/<first two hex digits>/<catalog key hex>.chunk`. A put is one
//! PUT of the encoded chunk (atomic in every object_store backend); the receipt is returned
//! once the PUT completed (for `file://`, object_store's local store fsyncs the file and its
//! directory first). A get downloads the object and verifies it like every tier.
//!
//! S3 clients use path-style requests, bounded retries (3 tries within 30 s, so a dead
//! endpoint fails in seconds rather than minutes) and the ring TLS provider, which this
//! module installs as the process default if none is (reqwest needs one).

use std::sync::Arc;
use std::time::Instant;

use futures_util::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use den_protocol::candidate::Tier;

use crate::tiers::format;
use crate::tiers::{
    BoxFuture, Chunk, ChunkKey, ChunkStore, IoMeter, IoSample, IoTotals, ObjectConfig, ObjectUrl,
    Receipt, TierError, Usage,
};

const SUFFIX: &str = ".chunk";

/// The object_store client for `config` and the object-name prefix inside it ("" for
/// none). Creates the directory of a `file://` URL; nothing is contacted yet. Shared by
/// the object tier and the workers' model downloads.
pub fn open_store(config: &ObjectConfig) -> Result<(Arc<dyn ObjectStore>, String), TierError> {
    let (store, prefix): (Arc<dyn ObjectStore>, String) = match &config.url {
        ObjectUrl::Memory { prefix } => (Arc::new(InMemory::new()), prefix.clone()),
        ObjectUrl::File { dir } => {
            std::fs::create_dir_all(dir).map_err(|e| TierError::Io {
                tier: Tier::Object,
                op: "create directory",
                location: dir.display().to_string(),
                message: e.to_string(),
            })?;
            let fs = LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| TierError::Config(e.to_string()))?
                .with_fsync(true);
            (Arc::new(fs), String::new())
        }
        ObjectUrl::S3 { bucket, prefix } => (s3_store(config, bucket)?, prefix.clone()),
    };
    Ok((store, prefix))
}

/// An S3-compatible client (path-style requests, bounded retries, ring TLS).
#[cfg(feature = "s3")]
fn s3_store(config: &ObjectConfig, bucket: &str) -> Result<Arc<dyn ObjectStore>, TierError> {
    use object_store::aws::AmazonS3Builder;
    use object_store::{BackoffConfig, ClientOptions, RetryConfig};
    use std::time::Duration;
    config.s3.validate().map_err(TierError::Config)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let s = &config.s3;
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(s.region.clone().unwrap_or_else(|| "us-east-1".to_owned()))
        .with_virtual_hosted_style_request(false)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
        })
        // Client options replace the builder's, allow_http included, so
        // allow_http is set after them.
        .with_client_options(
            ClientOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(120)),
        )
        .with_allow_http(s.http_allowed());
    if let Some(ep) = &s.endpoint {
        b = b.with_endpoint(ep);
    }
    if let (Some(id), Some(secret)) = (&s.access_key_id, &s.secret_access_key) {
        b = b
            .with_access_key_id(id)
            .with_secret_access_key(secret.expose());
    }
    if let Some(token) = &s.session_token {
        b = b.with_token(token.expose());
    }
    let store = b.build().map_err(|e| TierError::Config(e.to_string()))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "s3"))]
fn s3_store(_config: &ObjectConfig, _bucket: &str) -> Result<Arc<dyn ObjectStore>, TierError> {
    Err(TierError::Config(
        "this binary was built without S3 support (cargo feature `s3`); use den-agent".to_owned(),
    ))
}

/// Chunks in an object store.
#[derive(Debug, Clone)]
pub struct ObjectTier {
    store: Arc<dyn ObjectStore>,
    url: ObjectUrl,
    /// Object-name prefix inside the store ("" for none).
    prefix: String,
    meter: Arc<IoMeter>,
}

impl ObjectTier {
    /// Builds the client for `config.url`. Creates the directory of a `file://` URL.
    /// Nothing is contacted yet: a wrong endpoint or missing bucket shows up on first use.
    pub fn open(config: &ObjectConfig) -> Result<Self, TierError> {
        let (store, prefix) = open_store(config)?;
        Ok(ObjectTier {
            store,
            url: config.url.clone(),
            prefix,
            meter: Arc::new(IoMeter::default()),
        })
    }

    pub fn url(&self) -> &ObjectUrl {
        &self.url
    }

    /// The underlying store (tools and tests; bypasses verification).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The object name of `key`.
    pub fn location(&self, key: ChunkKey) -> Path {
        let hex = key.hex();
        let shard = hex.get(..2).unwrap_or("00");
        if self.prefix.is_empty() {
            Path::from(format!("{shard}/{hex}{SUFFIX}"))
        } else {
            Path::from(format!("{}/{shard}/{hex}{SUFFIX}", self.prefix))
        }
    }

    fn io_err(&self, op: &'static str, path: &Path, e: object_store::Error) -> TierError {
        TierError::Io {
            tier: Tier::Object,
            op,
            location: self.display_path(path),
            message: e.to_string(),
        }
    }

    fn display_path(&self, path: &Path) -> String {
        match &self.url {
            ObjectUrl::S3 { bucket, .. } => format!("s3://{bucket}/{path}"),
            ObjectUrl::File { dir } => format!("file://{}/{path}", dir.display()),
            ObjectUrl::Memory { .. } => format!("memory://{path}"),
        }
    }

    async fn get_inner(&self, key: ChunkKey) -> Result<Chunk, TierError> {
        let t0 = Instant::now();
        let path = self.location(key);
        let got = match self.store.get(&path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(TierError::Missing {
                    tier: Tier::Object,
                    key,
                });
            }
            Err(e) => return Err(self.io_err("get", &path, e)),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.io_err("download", &path, e))?;
        let n = bytes.len() as u64;
        let (chunk, _) = format::decode_bytes(Tier::Object, key, bytes)?;
        self.meter.read(IoSample {
            bytes: n,
            elapsed: t0.elapsed(),
        });
        Ok(chunk)
    }
}

impl ChunkStore for ObjectTier {
    fn tier(&self) -> Tier {
        Tier::Object
    }

    fn describe(&self) -> String {
        format!("object: {}", self.url)
    }

    fn put<'a>(&'a self, chunk: &'a Chunk) -> BoxFuture<'a, Result<Receipt, TierError>> {
        Box::pin(async move {
            let t0 = Instant::now();
            let key = chunk.key();
            let path = self.location(key);
            let (encoded, hash) = chunk.encode();
            let size = encoded.len() as u64;
            self.store
                .put(&path, PutPayload::from(encoded))
                .await
                .map_err(|e| self.io_err("put", &path, e))?;
            let io = IoSample {
                bytes: size,
                elapsed: t0.elapsed(),
            };
            self.meter.write(io, 0);
            Ok(Receipt {
                tier: Tier::Object,
                key,
                content_hash: hash,
                stored_bytes: size,
                fresh: true,
                evicted: Vec::new(),
                io,
            })
        })
    }

    fn get(&self, key: ChunkKey) -> BoxFuture<'_, Result<Chunk, TierError>> {
        Box::pin(async move {
            let r = self.get_inner(key).await;
            self.meter.failed(&r);
            r
        })
    }

    fn contains(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>> {
        Box::pin(async move {
            let path = self.location(key);
            match self.store.head(&path).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(self.io_err("head", &path, e)),
            }
        })
    }

    fn delete(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>> {
        Box::pin(async move {
            // S3 answers a DELETE of a missing object with success, so ask first.
            if !self.contains(key).await? {
                return Ok(false);
            }
            let path = self.location(key);
            match self.store.delete(&path).await {
                Ok(()) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(self.io_err("delete", &path, e)),
            }
        })
    }

    /// Lists every chunk object under the prefix (one LIST page per 1000 objects).
    fn usage(&self) -> BoxFuture<'_, Result<Usage, TierError>> {
        Box::pin(async move {
            let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
            let mut listing = self.store.list(prefix.as_ref());
            let mut usage = Usage::default();
            while let Some(meta) = listing
                .try_next()
                .await
                .map_err(|e| self.io_err("list", prefix.as_ref().unwrap_or(&Path::default()), e))?
            {
                if meta.location.as_ref().ends_with(SUFFIX) {
                    usage.bytes += meta.size;
                    usage.count += 1;
                }
            }
            Ok(usage)
        })
    }

    fn io_totals(&self) -> IoTotals {
        self.meter.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::S3Settings;
    use crate::tiers::test_support::{chunk, run};

    fn config(url: &str) -> ObjectConfig {
        ObjectConfig {
            url: url.parse().unwrap(),
            s3: S3Settings::default(),
        }
    }

    async fn round_trip(tier: &ObjectTier) {
        let a = chunk("m", 1, 16, 128);
        let b = chunk("other-model", 1, 16, 128);
        assert!(!tier.contains(a.key()).await.unwrap());
        let r = tier.put(&a).await.unwrap();
        assert_eq!(
            (r.tier, r.fresh, r.content_hash),
            (Tier::Object, true, a.content_hash())
        );
        let rb = tier.put(&b).await.unwrap();
        assert!(tier.contains(a.key()).await.unwrap());
        assert_eq!(tier.get(a.key()).await.unwrap(), a);
        assert_eq!(tier.get(b.key()).await.unwrap(), b);
        let u = tier.usage().await.unwrap();
        assert_eq!((u.count, u.bytes), (2, r.stored_bytes + rb.stored_bytes));
        assert!(tier.delete(a.key()).await.unwrap());
        assert!(!tier.delete(a.key()).await.unwrap());
        let e = tier.get(a.key()).await.unwrap_err();
        assert!(
            matches!(
                e,
                TierError::Missing {
                    tier: Tier::Object,
                    ..
                }
            ),
            "{e}"
        );
        let t = tier.io_totals();
        assert_eq!((t.writes.count, t.reads.count, t.misses), (2, 2, 1));
    }

    #[test]
    fn memory_object_round_trip() {
        run(async {
            let tier = ObjectTier::open(&config("memory://den/test")).unwrap();
            assert_eq!(
                tier.location(ChunkKey::of(&"m".into(), Default::default()))
                    .as_ref()
                    .split('/')
                    .count(),
                4
            );
            round_trip(&tier).await;
        });
    }

    #[test]
    fn file_object_round_trip() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}/objects", dir.path().display());
            let tier = ObjectTier::open(&config(&url)).unwrap();
            round_trip(&tier).await;
        });
    }

    #[test]
    fn file_object_flipped_byte_is_corrupt() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}", dir.path().display());
            let tier = ObjectTier::open(&config(&url)).unwrap();
            let c = chunk("m", 9, 8, 64);
            tier.put(&c).await.unwrap();
            let file = dir.path().join(tier.location(c.key()).as_ref());
            let mut bytes = std::fs::read(&file).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x10;
            std::fs::write(&file, &bytes).unwrap();
            let e = tier.get(c.key()).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    TierError::Corrupt {
                        tier: Tier::Object,
                        ..
                    }
                ),
                "{e}"
            );
            assert_eq!(tier.io_totals().corrupt, 1);
        });
    }

    #[test]
    fn s3_config_errors_are_clear() {
        let mut cfg = config("s3://bucket/p");
        cfg.s3.access_key_id = Some("id".into());
        let e = ObjectTier::open(&cfg).unwrap_err();
        assert!(e.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{e}");
        // A valid S3 config builds without contacting anything.
        let ok = ObjectTier::open(&config("s3://bucket/p")).unwrap();
        assert_eq!(ok.describe(), "object: s3://bucket/p");
    }
}
