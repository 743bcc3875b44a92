//! A fingerprint of a model's weights, independent of the file's metadata and layout.
//!
//! SHA-256 over, in order: the domain string [`WEIGHTS_DIGEST_DOMAIN`]; the tensor count
//! (u64); for each tensor in table order its name (u64 length, bytes), dims count (u32),
//! dims (u64 each), ggml type id (u32) and byte length (u64); then each tensor's data in
//! table order. All integers little-endian. Metadata, offsets, padding and alignment are
//! not covered: two files with the same tensors, in the same order, with the same bytes,
//! fingerprint the same. Later this is combined with the KV-cache dtype and row layout to
//! name what a KV page's contents depend on.

use sha2::{Digest, Sha256};

use crate::gguf::GgufFile;

/// The digest's first bytes: names the scheme, so a change of scheme changes every digest.
pub const WEIGHTS_DIGEST_DOMAIN: &[u8] = b"den-model weights-digest v1\0";

/// Data are hashed this many bytes at a time (a memory map is faulted in as it is read).
const CHUNK: usize = 1 << 20;

/// The weights' fingerprint: see the module documentation for what it covers.
pub fn weights_digest(file: &GgufFile) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(WEIGHTS_DIGEST_DOMAIN);
    let tensors = file.tensors();
    h.update((tensors.len() as u64).to_le_bytes());
    for t in tensors {
        h.update((t.name().len() as u64).to_le_bytes());
        h.update(t.name().as_bytes());
        h.update((t.dims().len() as u32).to_le_bytes());
        for d in t.dims() {
            h.update(d.to_le_bytes());
        }
        h.update(t.ggml_type().id().to_le_bytes());
        h.update(t.n_bytes().to_le_bytes());
    }
    for t in tensors {
        for chunk in file.tensor_data(t).chunks(CHUNK) {
            h.update(chunk);
        }
    }
    h.finalize().into()
}
