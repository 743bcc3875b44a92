//! The `ssd` tier: one file per chunk under a data directory, read through memmap2.
//!
//! Layout: `DIR/chunks/<first two hex digits>/<catalog key hex>.chunk`, temporary files in
//! `DIR/tmp/`. A put writes the encoded chunk to a fresh temporary file, fsyncs it, renames
//! it into place (atomic) and fsyncs the directory; only then is the receipt returned.
//! Published files are never modified. A get maps the file, verifies header and content
//! hash on the mapping (no copy), then copies the payload out; a corrupt file is deleted so
//! that a later put can store a good copy. The index (LRU order, sizes) is rebuilt from the
//! directory at open, oldest modification time first; leftover temporary files from a crash
//! are removed.
//!
//! Blocking file work runs on tokio's blocking pool.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use memmap2::{Mmap, MmapOptions};

use den_protocol::candidate::Tier;

use crate::tiers::format::{self, Verified};
use crate::tiers::lru::LruIndex;
use crate::tiers::{
    BoxFuture, Chunk, ChunkKey, ChunkStore, IoMeter, IoSample, IoTotals, Receipt, TierError, Usage,
};

const SUFFIX: &str = ".chunk";

/// Chunk files on local disk.
#[derive(Debug, Clone)]
pub struct SsdTier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    chunks: PathBuf,
    tmp: PathBuf,
    index: Mutex<LruIndex<()>>,
    meter: IoMeter,
    seq: AtomicU64,
}

impl SsdTier {
    /// Opens (creating if needed) the tier under `dir`, holding at most `capacity_bytes`.
    /// Existing chunk files are indexed; if they exceed the capacity the oldest are deleted.
    pub fn open(dir: impl Into<PathBuf>, capacity_bytes: u64) -> Result<Self, TierError> {
        let dir = dir.into();
        let chunks = dir.join("chunks");
        let tmp = dir.join("tmp");
        for d in [&chunks, &tmp] {
            fs::create_dir_all(d).map_err(|e| io_err("create directory", d, e))?;
        }
        clear_tmp(&tmp)?;
        let mut found = scan(&chunks)?;
        found.sort();
        let mut index = LruIndex::new(capacity_bytes);
        for (_, key, size) in found {
            match index.insert(key, size, ()) {
                Ok(evicted) => {
                    for (k, ()) in evicted {
                        remove_quietly(&chunk_path(&chunks, k));
                    }
                }
                Err(_) => remove_quietly(&chunk_path(&chunks, key)),
            }
        }
        Ok(SsdTier {
            inner: Arc::new(Inner {
                dir,
                chunks,
                tmp,
                index: Mutex::new(index),
                meter: IoMeter::default(),
                seq: AtomicU64::new(0),
            }),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Where the chunk `key` lives (whether or not it exists).
    pub fn path_of(&self, key: ChunkKey) -> PathBuf {
        chunk_path(&self.inner.chunks, key)
    }

    /// Every indexed key, least recently used first (for re-advertising after a restart).
    pub fn keys(&self) -> Vec<ChunkKey> {
        self.inner.index().keys_oldest_first()
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, TierError> + Send + 'static,
    ) -> Result<T, TierError> {
        let inner = Arc::clone(&self.inner);
        let dir = self.inner.dir.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| TierError::Io {
                tier: Tier::Ssd,
                op: "run blocking file task for",
                location: dir.display().to_string(),
                message: e.to_string(),
            })?
    }
}

impl ChunkStore for SsdTier {
    fn tier(&self) -> Tier {
        Tier::Ssd
    }

    fn describe(&self) -> String {
        format!(
            "ssd: {} (capacity {} bytes)",
            self.inner.dir.display(),
            self.inner.index().capacity()
        )
    }

    fn put<'a>(&'a self, chunk: &'a Chunk) -> BoxFuture<'a, Result<Receipt, TierError>> {
        let chunk = chunk.clone();
        Box::pin(self.blocking(move |inner| inner.put(&chunk)))
    }

    fn get(&self, key: ChunkKey) -> BoxFuture<'_, Result<Chunk, TierError>> {
        Box::pin(async move {
            let r = self.blocking(move |inner| inner.get(key)).await;
            self.inner.meter.failed(&r);
            r
        })
    }

    fn contains(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>> {
        Box::pin(async move { Ok(self.inner.index().contains(&key)) })
    }

    fn delete(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>> {
        Box::pin(self.blocking(move |inner| {
            let indexed = inner.index().remove(&key).is_some();
            let path = chunk_path(&inner.chunks, key);
            match fs::remove_file(&path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(indexed),
                Err(e) => Err(io_err("delete", &path, e)),
            }
        }))
    }

    fn usage(&self) -> BoxFuture<'_, Result<Usage, TierError>> {
        Box::pin(async move { Ok(self.inner.index().usage()) })
    }

    fn io_totals(&self) -> IoTotals {
        self.inner.meter.snapshot()
    }
}

impl Inner {
    fn index(&self) -> MutexGuard<'_, LruIndex<()>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, chunk: &Chunk) -> Result<Receipt, TierError> {
        let t0 = Instant::now();
        let key = chunk.key();
        let path = chunk_path(&self.chunks, key);
        if self.index().contains(&key) {
            // First writer wins: an intact copy is kept; a damaged one is replaced.
            match self.read_verified(key, &path) {
                Ok((v, map)) => {
                    return Ok(Receipt {
                        tier: Tier::Ssd,
                        key,
                        content_hash: v.content_hash,
                        stored_bytes: map.len() as u64,
                        fresh: false,
                        evicted: Vec::new(),
                        io: IoSample {
                            bytes: 0,
                            elapsed: t0.elapsed(),
                        },
                    });
                }
                Err(_) => self.discard(key, &path),
            }
        }
        let (encoded, hash) = chunk.encode();
        let size = encoded.len() as u64;
        let capacity = self.index().capacity();
        if size > capacity {
            return Err(TierError::TooLarge {
                tier: Tier::Ssd,
                key,
                bytes: size,
                capacity,
            });
        }
        self.write_durably(key, &path, &encoded)?;
        let evicted = self
            .index()
            .insert(key, size, ())
            .map_err(|_| TierError::TooLarge {
                tier: Tier::Ssd,
                key,
                bytes: size,
                capacity,
            })?;
        let evicted: Vec<ChunkKey> = evicted.into_iter().map(|(k, ())| k).collect();
        for k in &evicted {
            remove_quietly(&chunk_path(&self.chunks, *k));
        }
        let io = IoSample {
            bytes: size,
            elapsed: t0.elapsed(),
        };
        self.meter.write(io, evicted.len());
        Ok(Receipt {
            tier: Tier::Ssd,
            key,
            content_hash: hash,
            stored_bytes: size,
            fresh: true,
            evicted,
            io,
        })
    }

    /// temp file → write → fsync → rename into place → fsync the directory.
    fn write_durably(&self, key: ChunkKey, path: &Path, bytes: &[u8]) -> Result<(), TierError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .tmp
            .join(format!("{}.{}.{seq}.tmp", key.hex(), std::process::id()));
        let result = (|| {
            let mut f = File::create_new(&tmp).map_err(|e| io_err("create", &tmp, e))?;
            f.write_all(bytes).map_err(|e| io_err("write", &tmp, e))?;
            f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
            drop(f);
            let shard = path.parent().unwrap_or(&self.chunks);
            if !shard.is_dir() {
                fs::create_dir_all(shard).map_err(|e| io_err("create directory", shard, e))?;
                fsync_dir(&self.chunks)?;
            }
            fs::rename(&tmp, path).map_err(|e| io_err("rename into", path, e))?;
            fsync_dir(shard)
        })();
        if result.is_err() {
            remove_quietly(&tmp);
        }
        result
    }

    fn get(&self, key: ChunkKey) -> Result<Chunk, TierError> {
        let t0 = Instant::now();
        let path = chunk_path(&self.chunks, key);
        match self.read_verified(key, &path) {
            Ok((v, map)) => {
                let payload =
                    Bytes::copy_from_slice(map.get(v.payload.clone()).unwrap_or_default());
                self.index().touch(&key);
                self.meter.read(IoSample {
                    bytes: map.len() as u64,
                    elapsed: t0.elapsed(),
                });
                Ok(Chunk {
                    meta: v.meta,
                    payload,
                })
            }
            Err(e) => {
                if e.means_recompute() {
                    self.discard(key, &path);
                }
                Err(e)
            }
        }
    }

    /// Maps the file and verifies it in place.
    fn read_verified(&self, key: ChunkKey, path: &Path) -> Result<(Verified, Mmap), TierError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(TierError::Missing {
                    tier: Tier::Ssd,
                    key,
                });
            }
            Err(e) => return Err(io_err("open", path, e)),
        };
        // `populate` pre-faults the whole mapping in one call (MAP_POPULATE): the file is
        // read entirely anyway, and one fault per 4 KiB page costs more than the hash.
        // SAFETY: chunk files are published by rename and never modified afterwards; a
        // concurrent delete (eviction) keeps the mapping valid. Only truncation of the file
        // by another process could fault, and nothing in den truncates chunk files.
        let map = unsafe { MmapOptions::new().populate().map(&file) }
            .map_err(|e| io_err("map", path, e))?;
        let v = format::decode(Tier::Ssd, key, &map)?;
        Ok((v, map))
    }

    /// Forgets a missing or damaged chunk and deletes its file.
    fn discard(&self, key: ChunkKey, path: &Path) {
        self.index().remove(&key);
        if path.exists() {
            tracing::warn!(key = %key, path = %path.display(), "deleting damaged chunk file");
            remove_quietly(path);
        }
    }
}

fn chunk_path(chunks: &Path, key: ChunkKey) -> PathBuf {
    let hex = key.hex();
    let shard = hex.get(..2).unwrap_or("00").to_owned();
    chunks.join(shard).join(format!("{hex}{SUFFIX}"))
}

fn io_err(op: &'static str, path: &Path, e: io::Error) -> TierError {
    TierError::Io {
        tier: Tier::Ssd,
        op,
        location: path.display().to_string(),
        message: e.to_string(),
    }
}

fn fsync_dir(dir: &Path) -> Result<(), TierError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync directory", dir, e))
}

fn remove_quietly(path: &Path) {
    if let Err(e) = fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not delete chunk file");
    }
}

fn clear_tmp(tmp: &Path) -> Result<(), TierError> {
    let entries = fs::read_dir(tmp).map_err(|e| io_err("list", tmp, e))?;
    for entry in entries.flatten() {
        remove_quietly(&entry.path());
    }
    Ok(())
}

/// `(modified, key, size)` of every well-named chunk file.
fn scan(chunks: &Path) -> Result<Vec<(SystemTime, ChunkKey, u64)>, TierError> {
    let mut out = Vec::new();
    let shards = fs::read_dir(chunks).map_err(|e| io_err("list", chunks, e))?;
    for shard in shards.flatten() {
        let Ok(files) = fs::read_dir(shard.path()) else {
            continue;
        };
        for file in files.flatten() {
            let name = file.file_name();
            let key = name
                .to_str()
                .and_then(|n| n.strip_suffix(SUFFIX))
                .and_then(ChunkKey::parse);
            let (Some(key), Ok(meta)) = (key, file.metadata()) else {
                tracing::warn!(path = %file.path().display(), "ignoring unexpected file in chunk directory");
                continue;
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            out.push((modified, key, meta.len()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::test_support::{chunk, run};

    #[test]
    fn ssd_round_trip_survives_reopen() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let c = chunk("m", 1, 16, 256);
            {
                let ssd = SsdTier::open(dir.path(), 1 << 20).unwrap();
                let r = ssd.put(&c).await.unwrap();
                assert!(r.fresh);
                // The receipt means the file is in place under its key, complete.
                let on_disk = fs::read(ssd.path_of(c.key())).unwrap();
                assert_eq!(on_disk.len() as u64, r.stored_bytes);
                assert_eq!(on_disk, c.encode().0);
                assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
                assert_eq!(ssd.get(c.key()).await.unwrap(), c);
                assert!(!ssd.put(&c).await.unwrap().fresh);
            }
            let ssd = SsdTier::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(ssd.keys(), vec![c.key()]);
            assert_eq!(ssd.get(c.key()).await.unwrap(), c);
            assert_eq!(ssd.usage().await.unwrap().count, 1);
            assert!(ssd.delete(c.key()).await.unwrap());
            assert!(!ssd.path_of(c.key()).exists());
            let e = ssd.get(c.key()).await.unwrap_err();
            assert!(matches!(
                e,
                TierError::Missing {
                    tier: Tier::Ssd,
                    ..
                }
            ));
            assert_eq!(ssd.io_totals().misses, 1);
        });
    }

    #[test]
    fn ssd_flipped_byte_is_corrupt_and_the_file_is_dropped() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let ssd = SsdTier::open(dir.path(), 1 << 20).unwrap();
            let c = chunk("m", 2, 8, 128);
            ssd.put(&c).await.unwrap();
            let path = ssd.path_of(c.key());
            let mut bytes = fs::read(&path).unwrap();
            let at = bytes.len() - 100;
            bytes[at] ^= 0x04;
            fs::write(&path, &bytes).unwrap();
            let e = ssd.get(c.key()).await.unwrap_err();
            assert!(
                matches!(&e, TierError::Corrupt { field: "content sha256", expected, got, .. } if expected != got),
                "{e}"
            );
            assert!(e.means_recompute());
            assert_eq!(ssd.io_totals().corrupt, 1);
            assert!(!path.exists());
            assert!(!ssd.contains(c.key()).await.unwrap());
            // Recompute and store again: good as new.
            assert!(ssd.put(&c).await.unwrap().fresh);
            assert_eq!(ssd.get(c.key()).await.unwrap(), c);
        });
    }

    #[test]
    fn ssd_truncated_or_foreign_files_are_corrupt_not_wrong() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let ssd = SsdTier::open(dir.path(), 1 << 20).unwrap();
            let a = chunk("m", 3, 8, 64);
            let b = chunk("m", 4, 8, 64);
            ssd.put(&a).await.unwrap();
            ssd.put(&b).await.unwrap();
            // b's bytes under a's name: a valid chunk, but not the one asked for.
            fs::copy(ssd.path_of(b.key()), ssd.path_of(a.key())).unwrap();
            let e = ssd.get(a.key()).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    TierError::Corrupt {
                        field: "catalog key",
                        ..
                    }
                ),
                "{e}"
            );
            // A truncated (torn) file.
            let pb = ssd.path_of(b.key());
            let bytes = fs::read(&pb).unwrap();
            fs::write(&pb, &bytes[..bytes.len() / 2]).unwrap();
            assert!(ssd.get(b.key()).await.unwrap_err().means_recompute());
            // An empty file.
            ssd.put(&b).await.unwrap();
            fs::write(&pb, b"").unwrap();
            assert!(matches!(
                ssd.get(b.key()).await,
                Err(TierError::Corrupt {
                    field: "length",
                    ..
                })
            ));
        });
    }

    #[test]
    fn ssd_failed_write_returns_no_receipt_and_indexes_nothing() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let ssd = SsdTier::open(dir.path(), 1 << 20).unwrap();
            let c = chunk("m", 10, 8, 64);
            // A regular file where the chunk's shard directory must go: the rename fails.
            let shard = ssd.path_of(c.key()).parent().unwrap().to_path_buf();
            fs::write(&shard, b"in the way").unwrap();
            let e = ssd.put(&c).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    TierError::Io {
                        tier: Tier::Ssd,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(!ssd.contains(c.key()).await.unwrap());
            assert_eq!(ssd.usage().await.unwrap().count, 0);
            assert_eq!(ssd.io_totals().writes.count, 0);
            assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
            fs::remove_file(&shard).unwrap();
            assert!(ssd.put(&c).await.unwrap().fresh);
        });
    }

    #[test]
    fn ssd_evicts_lru_files_and_cleans_tmp_on_open() {
        run(async {
            let dir = tempfile::tempdir().unwrap();
            let a = chunk("m", 5, 8, 64);
            let b = chunk("m", 6, 8, 64);
            let c = chunk("m", 7, 8, 64);
            let size = a.encode().0.len() as u64;
            let ssd = SsdTier::open(dir.path(), 2 * size).unwrap();
            ssd.put(&a).await.unwrap();
            ssd.put(&b).await.unwrap();
            ssd.get(a.key()).await.unwrap();
            let r = ssd.put(&c).await.unwrap();
            assert_eq!(r.evicted, vec![b.key()]);
            assert!(!ssd.path_of(b.key()).exists());
            assert_eq!(ssd.usage().await.unwrap().bytes, 2 * size);
            // A crash left a temp file and the tier is reopened smaller.
            fs::write(dir.path().join("tmp").join("x.tmp"), b"partial").unwrap();
            drop(ssd);
            let small = SsdTier::open(dir.path(), size).unwrap();
            assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
            assert_eq!(small.usage().await.unwrap().count, 1);
            assert!(matches!(
                small.put(&chunk("m", 8, 64, 64)).await,
                Err(TierError::TooLarge { .. })
            ));
        });
    }
}
