//! Where a card's artifact files come from: an object-store URL (`s3://bucket/prefix`,
//! `file:///dir`, `memory://prefix`, the object tier's forms), a plain absolute directory
//! (the same as `file://`), or an `http://`/`https://` base URL whose files are fetched
//! with one GET each at `BASE/PATH`.
//!
//! HTTP fetches follow redirects (reqwest's default, at most 10) but send no credentials
//! (a card has none), connect within [`CONNECT_TIMEOUT`] and fail when no byte arrives
//! for [`READ_TIMEOUT`]: a stalled server fails the attempt instead of hanging it.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use den_protocol::wire::ArtifactFile;

use crate::tiers::ObjectConfig;
use crate::tiers::object::open_store;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A parsed source.
#[derive(Debug, Clone)]
pub enum Source {
    Http(reqwest::Url),
    Object(String),
}

/// A file's bytes as they arrive; errors are one line.
pub type ByteStream = BoxStream<'static, Result<Bytes, String>>;

impl Source {
    /// The forms in the module documentation; the error says which forms exist.
    pub fn parse(source: &str) -> Result<Source, String> {
        let s = source.trim();
        if s.starts_with("http://") || s.starts_with("https://") {
            let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
            if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
                // Not echoed: it may hold a password.
                return Err(
                    "an http(s) source is a base URL without credentials, query or fragment"
                        .to_owned(),
                );
            }
            return Ok(Source::Http(url));
        }
        let object = if s.starts_with('/') {
            format!("file://{s}")
        } else {
            s.to_owned()
        };
        ObjectConfig::from_url_and_env(&object).map_err(|e| {
            format!(
                "{}; or an absolute directory, or an http(s):// base URL",
                e.reason
            )
        })?;
        Ok(Source::Object(object))
    }

    /// Opens `path` (relative, `/`-separated) for reading.
    pub async fn open(&self, path: &str) -> Result<ByteStream, String> {
        match self {
            Source::Http(base) => {
                let mut url = base.clone();
                url.path_segments_mut()
                    .map_err(|_| format!("{base} cannot be a base URL"))?
                    .pop_if_empty()
                    .extend(path.split('/'));
                let client = reqwest::Client::builder()
                    .tls_certs_merge(crate::tls::reqwest_roots())
                    .connect_timeout(CONNECT_TIMEOUT)
                    .read_timeout(READ_TIMEOUT)
                    .build()
                    .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
                let response =
                    client.get(url.clone()).send().await.map_err(|e| {
                        format!("fetching {url} failed: {}", one_line(&e.to_string()))
                    })?;
                let status = response.status();
                if status == reqwest::StatusCode::NOT_FOUND {
                    return Err(format!("{path} is missing from the source {base} (404)"));
                }
                if !status.is_success() {
                    return Err(format!("fetching {url} failed: HTTP {status}"));
                }
                let url = url.to_string();
                Ok(response
                    .bytes_stream()
                    .map(move |c| {
                        c.map_err(|e| format!("reading {url} failed: {}", one_line(&e.to_string())))
                    })
                    .boxed())
            }
            Source::Object(object) => {
                let config = ObjectConfig::from_url_and_env(object).map_err(|e| e.to_string())?;
                let (store, prefix) =
                    open_store(&config).map_err(|e| format!("source {object}: {e}"))?;
                let location = if prefix.is_empty() {
                    ObjectPath::from(path)
                } else {
                    ObjectPath::from(format!("{prefix}/{path}"))
                };
                let got = store.get(&location).await.map_err(|e| match e {
                    object_store::Error::NotFound { .. } => {
                        format!("{path} is missing from the source {object}")
                    }
                    other => format!(
                        "fetching {path} from {object} failed: {}",
                        one_line(&other.to_string())
                    ),
                })?;
                let object = object.clone();
                let path = path.to_owned();
                Ok(got
                    .into_stream()
                    .map(move |c| {
                        c.map_err(|e| {
                            format!(
                                "reading {path} from {object} failed: {}",
                                one_line(&e.to_string())
                            )
                        })
                    })
                    .boxed())
            }
        }
    }
}

/// Why a local file is not the one its card names.
#[derive(Debug)]
pub enum FileCheck<E> {
    Open(std::io::Error),
    Read(std::io::Error),
    /// `on_read` stopped the check.
    Stopped(E),
    /// Its size, not the card's.
    Size(u64),
    /// Its SHA-256, not the card's.
    Sha256(String),
}

/// Reads `path` through in 1 MiB buffers, checking its size and SHA-256 against `file`;
/// `on_read` sees every buffer and may stop the check (cancellation, a failed copy).
/// Blocking: call it from a blocking thread.
pub fn check_file<E>(
    path: &Path,
    file: &ArtifactFile,
    mut on_read: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), FileCheck<E>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(FileCheck::Open)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut read: u64 = 0;
    loop {
        let n = f.read(&mut buf).map_err(FileCheck::Read)?;
        if n == 0 {
            break;
        }
        let got = buf.get(..n).unwrap_or_default();
        hasher.update(got);
        on_read(got).map_err(FileCheck::Stopped)?;
        read += n as u64;
    }
    if read != file.bytes {
        return Err(FileCheck::Size(read));
    }
    let got = hex::encode(hasher.finalize());
    if got != file.sha256 {
        return Err(FileCheck::Sha256(got));
    }
    Ok(())
}

impl Source {
    /// Fetches `file` into `target` (created or truncated), hashing as bytes arrive:
    /// more bytes than the card says stop it at once; a short file or another SHA-256
    /// is an error naming the file; the written file is fsynced. `on_chunk` sees each
    /// chunk's length and may stop the fetch (cancellation; it also reports progress).
    pub async fn fetch_verified(
        &self,
        file: &ArtifactFile,
        target: &Path,
        mut on_chunk: impl FnMut(usize) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut stream = self.open(&file.path).await?;
        let mut out = tokio::fs::File::create(target)
            .await
            .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            written = written.saturating_add(chunk.len() as u64);
            if written > file.bytes {
                return Err(format!(
                    "size mismatch for {}: the card says {} bytes, the source has more",
                    file.path, file.bytes
                ));
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|e| format!("writing {} failed: {e}", target.display()))?;
            on_chunk(chunk.len())?;
        }
        if written != file.bytes {
            return Err(format!(
                "size mismatch for {}: expected {} bytes, got {written}",
                file.path, file.bytes
            ));
        }
        let got = hex::encode(hasher.finalize());
        if got != file.sha256 {
            return Err(format!(
                "checksum mismatch for {}: expected sha256 {}, got {got}",
                file.path, file.sha256
            ));
        }
        out.sync_all()
            .await
            .map_err(|e| format!("fsync of {} failed: {e}", target.display()))
    }
}

pub fn one_line(s: &str) -> String {
    den_protocol::text::one_line(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_take_object_urls_absolute_dirs_and_http_bases() {
        assert!(matches!(
            Source::parse("https://models.example/smol/"),
            Ok(Source::Http(_))
        ));
        assert!(
            matches!(Source::parse("/srv/models"), Ok(Source::Object(o)) if o == "file:///srv/models")
        );
        assert!(matches!(Source::parse("memory://m"), Ok(Source::Object(_))));
        let e = Source::parse("https://user:pw@host/x").unwrap_err();
        assert!(e.contains("without credentials"), "{e}");
        let e = Source::parse("models/relative").unwrap_err();
        assert!(e.contains("http(s)://"), "{e}");
    }
}
