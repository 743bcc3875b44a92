//! The KV cache in den's pages: the row layout, the page interface attention reads
//! through, a host arena, a sequence's page table, and the fingerprint that names what a
//! page's bytes depend on.
//!
//! # Row layout
//!
//! One row per token, every layer's K and V for it:
//!
//! ```text
//! row = [layer 0: K[kv_head 0][head_dim], …, K[kv_heads-1][…] | V[kv_head 0][head_dim], …]
//!       [layer 1: K … | V …] … [layer L-1: K … | V …]
//! ```
//!
//! i.e. `[layer][K|V][kv_head][head_dim]`, each element an IEEE **f16**, little-endian:
//! `row_bytes = layers × 2 × kv_heads × head_dim × 2` (SmolLM2-135M: 30 × 2 × 3 × 64 × 2 =
//! 23,040 B; Gemma 3 270M: 18 × 2 × 1 × 256 × 2 = 18,432 B). f16 because it is ggml's
//! (llama.cpp's) default KV-cache type, so den's cache rounds K and V exactly where the
//! reference implementation does; it is as small as bf16 and has three more mantissa bits
//! (11 significant bits against 8), and K/V values after RMSNorm-ed projections stay far
//! inside f16's range (±65504). K is stored after RoPE (and after Gemma's per-head norm),
//! so a row is final: attention never recomputes anything from it.
//!
//! # Pages
//!
//! den's arena is page-major with a page's rows contiguous: page `p`, slot `r` is at byte
//! `(p × page_size + r) × row_bytes` (`agent/src/memory/mod.rs`). A [`Sequence`] is a
//! route's page table: logical page `i` holds positions `i × page_size ..
//! (i + 1) × page_size`. Attention for position `t` reads the rows of positions `0..=t`
//! through the table ([`KvPages::row`]); a sliding window is a mask in attention, never a
//! missing row: every layer's row is kept for every token.

use sha2::{Digest, Sha256};

use crate::fingerprint::weights_digest;
use crate::gguf::GgufFile;

/// The KV element type, as named in fingerprints.
pub const KV_DTYPE: &str = "f16";
/// Bytes per KV element.
pub const KV_ELEM_BYTES: usize = 2;
/// The row layout, as named in fingerprints.
pub const ROW_LAYOUT: &str = "[layer][K|V][kv_head][head_dim]";
/// The fingerprint's first bytes: a change of scheme changes every fingerprint.
pub const KV_FINGERPRINT_DOMAIN: &[u8] = b"den-model kv-fingerprint v1\0";

/// Why a KV operation was refused. One line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("invalid KV arena: {0}")]
    Geometry(String),
    #[error("out of KV pages: {needed} more needed, {free} free (of {total})")]
    OutOfPages { needed: u64, free: u32, total: u32 },
    #[error("position {pos} has no KV row: the sequence has {pages} pages of {page_size} rows")]
    NoPage {
        pos: u32,
        pages: usize,
        page_size: u32,
    },
    #[error("page {page} slot {slot} is outside the KV arena")]
    NoRow { page: u32, slot: u32 },
    #[error("a KV row is {got} bytes, the model's layout needs {expected}")]
    RowSize { got: usize, expected: usize },
}

/// The shape of one KV row: `[layer][K|V][kv_head][head_dim]` of f16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
}

impl KvLayout {
    /// K (or V) elements of one layer: `kv_heads × head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads as usize * self.head_dim as usize
    }

    /// Bytes of one token's row, every layer's K and V.
    pub fn row_bytes(&self) -> usize {
        self.layers as usize * 2 * self.kv_dim() * KV_ELEM_BYTES
    }

    /// Byte offset of layer `layer`'s K in a row; its V follows at `+ kv_dim() × 2`.
    pub fn k_offset(&self, layer: usize) -> usize {
        layer * 2 * self.kv_dim() * KV_ELEM_BYTES
    }

    /// Byte offset of layer `layer`'s V in a row.
    pub fn v_offset(&self, layer: usize) -> usize {
        self.k_offset(layer) + self.kv_dim() * KV_ELEM_BYTES
    }

    /// The layout as a string, dims included: what a fingerprint covers besides the weights.
    pub fn describe(&self) -> String {
        format!(
            "kv:{KV_DTYPE}:{ROW_LAYOUT}:layers={},kv_heads={},head_dim={}",
            self.layers, self.kv_heads, self.head_dim
        )
    }
}

/// What a KV chunk's bytes depend on: the weights ([`weights_digest`]) and the KV dtype,
/// row layout and dims. SHA-256 of [`KV_FINGERPRINT_DOMAIN`] ‖ the 32-byte weights digest ‖
/// [`KvLayout::describe`] (u64 length, bytes) ‖ layers, kv_heads, head_dim (u32 LE each).
/// Chunks stored under one fingerprint are never restored into a model or layout with
/// another.
pub fn kv_fingerprint(weights_digest: &[u8; 32], layout: &KvLayout) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(KV_FINGERPRINT_DOMAIN);
    h.update(weights_digest);
    let desc = layout.describe();
    h.update((desc.len() as u64).to_le_bytes());
    h.update(desc.as_bytes());
    for d in [layout.layers, layout.kv_heads, layout.head_dim] {
        h.update(d.to_le_bytes());
    }
    h.finalize().into()
}

/// [`kv_fingerprint`] of a file's weights (hashes every tensor: a second or so per GB).
pub fn model_fingerprint(file: &GgufFile, layout: &KvLayout) -> [u8; 32] {
    kv_fingerprint(&weights_digest(file), layout)
}

/// Rows of KV in pages, as attention reads and writes them. Implemented over den's page
/// arena by the worker, and by [`HostKvPages`] here.
pub trait KvPages {
    /// Rows per page.
    fn page_size(&self) -> u32;
    /// Bytes per row.
    fn row_bytes(&self) -> usize;
    /// The row at `slot` of physical page `page`, or `None` outside the arena.
    fn row(&self, page: u32, slot: u32) -> Option<&[u8]>;
    /// The row at `slot` of physical page `page`, writable.
    fn row_mut(&mut self, page: u32, slot: u32) -> Option<&mut [u8]>;
}

/// A sequence's page table (a route's pages, in logical order) and how many positions of
/// it hold rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sequence {
    pages: Vec<u32>,
    len: u32,
}

impl Sequence {
    /// An empty sequence with no pages.
    pub fn new() -> Sequence {
        Sequence::default()
    }

    /// A sequence over `pages` whose first `len` positions already hold rows (a restored
    /// or shared prefix).
    pub fn with_pages(pages: Vec<u32>, len: u32) -> Sequence {
        Sequence { pages, len }
    }

    /// Positions that hold rows; the next row is written at position `len()`.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The page table.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// Appends a physical page to the table.
    pub fn push_page(&mut self, page: u32) {
        self.pages.push(page);
    }

    /// Marks positions `len()..len` as written (the forward pass's caller, after a batch
    /// that wrote them). Not checked against the pages: [`Sequence::locate`] is, on use.
    pub fn set_len(&mut self, len: u32) {
        self.len = len;
    }

    /// Forgets positions from `len` on (their rows stay in the pages, to be overwritten).
    pub fn truncate(&mut self, len: u32) {
        self.len = self.len.min(len);
    }

    /// Removes and returns the page table (to free the pages), leaving an empty sequence.
    pub fn take_pages(&mut self) -> Vec<u32> {
        self.len = 0;
        std::mem::take(&mut self.pages)
    }

    /// Positions the pages can hold.
    pub fn capacity(&self, page_size: u32) -> u64 {
        self.pages.len() as u64 * u64::from(page_size)
    }

    /// The physical page and slot of position `pos`, if the table covers it.
    pub fn locate(&self, pos: u32, page_size: u32) -> Option<(u32, u32)> {
        if page_size == 0 {
            return None;
        }
        let page = *self.pages.get((pos / page_size) as usize)?;
        Some((page, pos % page_size))
    }

    /// [`Sequence::locate`], or the error naming what is missing.
    pub fn locate_or_err(&self, pos: u32, page_size: u32) -> Result<(u32, u32), KvError> {
        self.locate(pos, page_size).ok_or(KvError::NoPage {
            pos,
            pages: self.pages.len(),
            page_size,
        })
    }
}

/// A KV arena in host memory: `pages × page_size` rows in one `Vec<u8>`, page-major like
/// den's arena, with a free list for tests and single-process use.
#[derive(Debug, Clone)]
pub struct HostKvPages {
    layout: KvLayout,
    page_size: u32,
    pages: u32,
    data: Vec<u8>,
    free: Vec<u32>,
}

impl HostKvPages {
    /// A zeroed arena of `pages` pages of `page_size` rows of `layout`.
    pub fn new(layout: KvLayout, page_size: u32, pages: u32) -> Result<HostKvPages, KvError> {
        let row = layout.row_bytes();
        if page_size == 0 || pages == 0 || row == 0 {
            return Err(KvError::Geometry(format!(
                "page_size {page_size}, pages {pages} and row_bytes {row} must all be non-zero"
            )));
        }
        let bytes = (page_size as usize)
            .checked_mul(pages as usize)
            .and_then(|n| n.checked_mul(row))
            .filter(|n| *n <= isize::MAX as usize)
            .ok_or_else(|| {
                KvError::Geometry(format!(
                    "{pages} pages of {page_size} rows of {row} bytes overflow"
                ))
            })?;
        Ok(HostKvPages {
            layout,
            page_size,
            pages,
            data: vec![0; bytes],
            // Popped from the end: pages are handed out 0, 1, 2, …
            free: (0..pages).rev().collect(),
        })
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Pages in the arena.
    pub fn page_count(&self) -> u32 {
        self.pages
    }

    /// Pages not handed out.
    pub fn free_pages(&self) -> u32 {
        self.free.len() as u32
    }

    /// Takes a free page.
    pub fn alloc_page(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Adds pages to `seq` until it can hold `len` positions.
    pub fn reserve(&mut self, seq: &mut Sequence, len: u32) -> Result<(), KvError> {
        let have = seq.capacity(self.page_size);
        let need = u64::from(len)
            .saturating_sub(have)
            .div_ceil(u64::from(self.page_size));
        if need > self.free.len() as u64 {
            return Err(KvError::OutOfPages {
                needed: need,
                free: self.free.len() as u32,
                total: self.pages,
            });
        }
        for _ in 0..need {
            if let Some(p) = self.free.pop() {
                seq.push_page(p);
            }
        }
        Ok(())
    }

    /// Returns `seq`'s pages to the free list and empties it.
    pub fn release(&mut self, seq: &mut Sequence) {
        self.free.extend(seq.take_pages().into_iter().rev());
    }

    /// The whole arena (page-major).
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    fn offset(&self, page: u32, slot: u32) -> Option<usize> {
        if page >= self.pages || slot >= self.page_size {
            return None;
        }
        Some((page as usize * self.page_size as usize + slot as usize) * self.layout.row_bytes())
    }
}

impl KvPages for HostKvPages {
    fn page_size(&self) -> u32 {
        self.page_size
    }

    fn row_bytes(&self) -> usize {
        self.layout.row_bytes()
    }

    fn row(&self, page: u32, slot: u32) -> Option<&[u8]> {
        let at = self.offset(page, slot)?;
        self.data.get(at..at + self.layout.row_bytes())
    }

    fn row_mut(&mut self, page: u32, slot: u32) -> Option<&mut [u8]> {
        let at = self.offset(page, slot)?;
        let n = self.layout.row_bytes();
        self.data.get_mut(at..at + n)
    }
}

/// KV pages over a borrowed page-major arena (den's worker arena: page `p`, slot `s` at row
/// `p × page_size + s`). Here rather than in the worker so the row lookups attention makes
/// for every position are compiled with the forward pass.
#[derive(Debug)]
pub struct ArenaRows<'a> {
    rows: &'a mut [u8],
    page_size: u32,
    row_bytes: usize,
}

impl<'a> ArenaRows<'a> {
    /// `rows` holds whole pages of `page_size` rows of `row_bytes` each.
    pub fn new(rows: &'a mut [u8], page_size: u32, row_bytes: usize) -> Result<Self, KvError> {
        let page = (page_size as usize).checked_mul(row_bytes).unwrap_or(0);
        if page == 0 || !rows.len().is_multiple_of(page) {
            return Err(KvError::Geometry(format!(
                "an arena of {} bytes is not whole pages of {page_size} rows of {row_bytes} bytes",
                rows.len()
            )));
        }
        Ok(ArenaRows {
            rows,
            page_size,
            row_bytes,
        })
    }

    fn range(&self, page: u32, slot: u32) -> Option<std::ops::Range<usize>> {
        if slot >= self.page_size {
            return None;
        }
        let row = (page as usize)
            .checked_mul(self.page_size as usize)?
            .checked_add(slot as usize)?;
        let start = row.checked_mul(self.row_bytes)?;
        let end = start.checked_add(self.row_bytes)?;
        (end <= self.rows.len()).then_some(start..end)
    }
}

impl KvPages for ArenaRows<'_> {
    fn page_size(&self) -> u32 {
        self.page_size
    }

    fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    fn row(&self, page: u32, slot: u32) -> Option<&[u8]> {
        let r = self.range(page, slot)?;
        self.rows.get(r)
    }

    fn row_mut(&mut self, page: u32, slot: u32) -> Option<&mut [u8]> {
        let r = self.range(page, slot)?;
        self.rows.get_mut(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_rows_are_page_major_and_bounded() {
        let mut bytes = vec![0u8; 2 * 4 * 3];
        let mut kv = ArenaRows::new(&mut bytes, 4, 3).unwrap();
        kv.row_mut(1, 2).unwrap().copy_from_slice(&[7, 8, 9]);
        assert_eq!(kv.row(1, 2), Some(&[7u8, 8, 9][..]));
        assert!(kv.row(1, 4).is_none(), "slot past the page");
        assert!(kv.row(2, 0).is_none(), "page past the arena");
        assert!(kv.row(u32::MAX, 3).is_none());
        assert_eq!(&bytes[(4 + 2) * 3..(4 + 3) * 3], &[7, 8, 9]);
        let mut odd = vec![0u8; 10];
        assert!(ArenaRows::new(&mut odd, 4, 3).is_err());
        assert!(ArenaRows::new(&mut odd, 0, 3).is_err());
    }

    const SMOL: KvLayout = KvLayout {
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
    };
    const GEMMA: KvLayout = KvLayout {
        layers: 18,
        kv_heads: 1,
        head_dim: 256,
    };

    #[test]
    fn row_bytes_of_the_real_models() {
        assert_eq!(SMOL.row_bytes(), 23_040);
        assert_eq!(GEMMA.row_bytes(), 18_432);
        assert_eq!(SMOL.k_offset(1), 768);
        assert_eq!(SMOL.v_offset(1), 768 + 384);
        assert_eq!(
            SMOL.describe(),
            "kv:f16:[layer][K|V][kv_head][head_dim]:layers=30,kv_heads=3,head_dim=64"
        );
    }

    #[test]
    fn arena_is_page_major() {
        let l = KvLayout {
            layers: 1,
            kv_heads: 1,
            head_dim: 2,
        };
        let mut kv = HostKvPages::new(l, 3, 4).unwrap();
        let rb = l.row_bytes();
        kv.row_mut(2, 1).unwrap().fill(7);
        let at = (2 * 3 + 1) * rb;
        assert!(kv.bytes()[at..at + rb].iter().all(|b| *b == 7));
        assert_eq!(kv.bytes().iter().filter(|b| **b == 7).count(), rb);
        assert!(kv.row(4, 0).is_none());
        assert!(kv.row(0, 3).is_none());
    }

    #[test]
    fn reserve_and_locate() {
        let mut kv = HostKvPages::new(GEMMA, 4, 3).unwrap();
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, 5).unwrap();
        assert_eq!(seq.pages(), &[0, 1]);
        assert_eq!(seq.locate(5, 4), Some((1, 1)));
        assert_eq!(seq.locate(8, 4), None);
        assert!(matches!(
            kv.reserve(&mut seq, 17),
            Err(KvError::OutOfPages {
                needed: 3,
                free: 1,
                ..
            })
        ));
        kv.reserve(&mut seq, 12).unwrap();
        assert_eq!(kv.free_pages(), 0);
        kv.release(&mut seq);
        assert_eq!(kv.free_pages(), 3);
        assert!(seq.pages().is_empty());
        assert_eq!(
            seq.locate_or_err(0, 4).unwrap_err().to_string(),
            "position 0 has no KV row: the sequence has 0 pages of 4 rows"
        );
    }

    #[test]
    fn fingerprint_covers_weights_and_layout() {
        let d = [1u8; 32];
        let a = kv_fingerprint(&d, &SMOL);
        assert_eq!(a, kv_fingerprint(&d, &SMOL));
        assert_ne!(a, kv_fingerprint(&[2u8; 32], &SMOL));
        let other = KvLayout {
            head_dim: 32,
            kv_heads: 6,
            ..SMOL
        };
        assert_eq!(other.row_bytes(), SMOL.row_bytes());
        assert_ne!(a, kv_fingerprint(&d, &other));
    }
}
