//! The `host` backend: the page arena in plain host memory. Works everywhere; used by the
//! demo, the tests and any worker without a GPU.
//!
//! The arena is one anonymous memory map, so a large arena costs nothing until pages are
//! touched (the kernel hands out zeroed pages lazily) and an allocation failure is an
//! error instead of an abort.

use std::time::Instant;

use memmap2::MmapMut;

use crate::memory::{
    ArenaGeometry, BackendKind, Direction, Gathered, MemoryError, PageIndex, PageMemory, RowRun,
    TimingSource, TransferStats, TransferTotals, plan_copies,
};

/// A page arena in host memory.
pub struct HostMemory {
    geometry: ArenaGeometry,
    arena: MmapMut,
    totals: TransferTotals,
}

impl HostMemory {
    /// Allocates the arena (zeroed).
    pub fn open(geometry: ArenaGeometry) -> Result<Self, MemoryError> {
        let bytes = geometry.arena_bytes();
        // `ArenaGeometry::new` guarantees the arena fits isize.
        let len = usize::try_from(bytes).map_err(|_| MemoryError::Alloc {
            what: "host page arena",
            bytes,
            message: "larger than the address space".into(),
        })?;
        let arena = MmapMut::map_anon(len).map_err(|e| MemoryError::Alloc {
            what: "host page arena",
            bytes,
            message: e.to_string(),
        })?;
        // Attention reads one layer's heads of every key: a few hundred bytes from each
        // of thousands of rows 23 KB apart (SmolLM2), a TLB miss each on 4 KiB pages.
        // Huge pages, where the kernel gives them on `madvise` (its default), take most of
        // those away: SmolLM2 decoding at 2,048 tokens of context on one thread, 84–85
        // ms a token instead of 88–90 (2026-12-07). Best effort: refused, the arena works
        // as before.
        #[cfg(target_os = "linux")]
        let _ = arena.advise(memmap2::Advice::HugePage);
        Ok(HostMemory {
            geometry,
            arena,
            totals: TransferTotals::default(),
        })
    }

    fn finish(
        &mut self,
        direction: Direction,
        bytes: u64,
        copies: usize,
        t0: Instant,
    ) -> TransferStats {
        let elapsed = t0.elapsed();
        let stats = TransferStats {
            direction,
            bytes,
            copies: u32::try_from(copies).unwrap_or(u32::MAX),
            elapsed,
            wall: elapsed,
            timing: TimingSource::HostClock,
        };
        self.totals.record(&stats);
        stats
    }
}

impl PageMemory for HostMemory {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn geometry(&self) -> ArenaGeometry {
        self.geometry
    }

    fn write_gathered(
        &mut self,
        runs: &[RowRun],
        src: Gathered<'_>,
    ) -> Result<TransferStats, MemoryError> {
        let len = src.len();
        let copies = plan_copies(&self.geometry, runs, len)?;
        let t0 = Instant::now();
        for c in &copies {
            // plan_copies checked every range against the arena and the buffer.
            let at = c.arena_offset as usize;
            let copied = self
                .arena
                .get_mut(at..at + c.len)
                .is_some_and(|dst| src.copy_to(c.buffer_offset, dst));
            if !copied {
                return Err(range_error(c.arena_offset, c.len, len));
            }
        }
        Ok(self.finish(Direction::Upload, len as u64, copies.len(), t0))
    }

    fn read_runs(&mut self, runs: &[RowRun], dst: &mut [u8]) -> Result<TransferStats, MemoryError> {
        let copies = plan_copies(&self.geometry, runs, dst.len())?;
        let t0 = Instant::now();
        let dst_len = dst.len();
        for c in &copies {
            let at = c.arena_offset as usize;
            let (Some(from), Some(to)) = (
                self.arena.get(at..at + c.len),
                dst.get_mut(c.buffer_offset..c.buffer_offset + c.len),
            ) else {
                return Err(range_error(c.arena_offset, c.len, dst_len));
            };
            to.copy_from_slice(from);
        }
        Ok(self.finish(Direction::Download, dst_len as u64, copies.len(), t0))
    }

    fn copy_page(&mut self, src: PageIndex, dst: PageIndex) -> Result<TransferStats, MemoryError> {
        for page in [src, dst] {
            if page >= self.geometry.page_count {
                return Err(MemoryError::PageOutOfRange {
                    page,
                    page_count: self.geometry.page_count,
                });
            }
        }
        let t0 = Instant::now();
        if src == dst {
            return Ok(self.finish(Direction::PageCopy, 0, 0, t0));
        }
        let page_bytes = self.geometry.page_bytes() as usize;
        let from = self.geometry.offset_of(src, 0) as usize;
        let to = self.geometry.offset_of(dst, 0) as usize;
        // Both pages were checked to be inside the arena; distinct pages never overlap.
        self.arena.copy_within(from..from + page_bytes, to);
        Ok(self.finish(Direction::PageCopy, page_bytes as u64, 1, t0))
    }

    fn totals(&self) -> &TransferTotals {
        &self.totals
    }

    fn describe(&self) -> String {
        let g = self.geometry;
        format!(
            "host: {} pages × {} rows × {} B/row ({:.1} MiB)",
            g.page_count,
            g.page_size,
            g.row_bytes,
            g.arena_bytes() as f64 / (1024.0 * 1024.0)
        )
    }

    fn host_rows(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.arena[..])
    }
}

fn range_error(arena_offset: u64, len: usize, buffer: usize) -> MemoryError {
    MemoryError::BufferSize {
        expected: arena_offset.saturating_add(len as u64),
        got: buffer as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn memory() -> HostMemory {
        HostMemory::open(ArenaGeometry::new(4, 16, 8).unwrap()).unwrap()
    }

    #[test]
    fn a_gathered_write_lands_as_the_joined_buffer_would() {
        // Three pieces whose boundaries fall mid-row and mid-run (runs of 3, 4 and 1
        // rows of 8 bytes; pieces of 20, 0, 28 and 16 bytes), written at once and left
        // "in flight" (host memory writes at once), read back as one buffer.
        let mut m = memory();
        let runs = [
            RowRun {
                page: 5,
                offset: 1,
                len: 3,
            },
            RowRun {
                page: 1,
                offset: 0,
                len: 4,
            },
            RowRun {
                page: 9,
                offset: 0,
                len: 1,
            },
        ];
        let src = pattern(8 * 8, 3);
        let (a, rest) = src.split_at(20);
        let (b, c) = rest.split_at(28);
        m.start_write(&runs, Gathered(&[a, &[], b, c])).unwrap();
        assert!(
            m.settle().unwrap().is_none(),
            "host memory leaves nothing in flight"
        );
        let mut back = vec![0u8; src.len()];
        m.read_runs(&runs, &mut back).unwrap();
        assert_eq!(back, src);
        // Pieces that do not fill the runs are refused before anything is written.
        let before = back.clone();
        let e = m.write_gathered(&runs, Gathered(&[a, b])).unwrap_err();
        assert!(matches!(e, MemoryError::BufferSize { .. }), "{e}");
        m.read_runs(&runs, &mut back).unwrap();
        assert_eq!(back, before);
    }

    #[test]
    fn host_round_trip_across_non_contiguous_pages() {
        let mut m = memory();
        let runs = [
            RowRun {
                page: 9,
                offset: 1,
                len: 3,
            },
            RowRun {
                page: 2,
                offset: 0,
                len: 4,
            },
            RowRun {
                page: 3,
                offset: 0,
                len: 2,
            },
            RowRun {
                page: 14,
                offset: 0,
                len: 1,
            },
        ];
        let src = pattern(10 * 8, 7);
        let w = m.write_runs(&runs, &src).unwrap();
        // Pages 2 and 3 are contiguous: 3 copies, not 4.
        assert_eq!((w.bytes, w.copies, w.direction), (80, 3, Direction::Upload));
        let mut back = vec![0u8; src.len()];
        let r = m.read_runs(&runs, &mut back).unwrap();
        assert_eq!(back, src);
        assert_eq!((r.bytes, r.direction), (80, Direction::Download));
        // Rows outside the runs were not touched.
        let mut untouched = vec![1u8; 8];
        m.read_runs(
            &[RowRun {
                page: 9,
                offset: 0,
                len: 1,
            }],
            &mut untouched,
        )
        .unwrap();
        assert_eq!(untouched, vec![0u8; 8]);
        // Reading the same rows in another order gives the rows in that order.
        let mut page3 = vec![0u8; 16];
        m.read_runs(
            &[RowRun {
                page: 3,
                offset: 0,
                len: 2,
            }],
            &mut page3,
        )
        .unwrap();
        assert_eq!(page3, src[56..72]);
        assert_eq!(m.totals().upload.bytes, 80);
        assert_eq!(m.totals().download.count, 3);
    }

    #[test]
    fn host_copy_page_duplicates_a_whole_page() {
        let mut m = memory();
        let src = pattern(32, 3);
        m.write_runs(
            &[RowRun {
                page: 5,
                offset: 0,
                len: 4,
            }],
            &src,
        )
        .unwrap();
        let s = m.copy_page(5, 11).unwrap();
        assert_eq!((s.bytes, s.direction), (32, Direction::PageCopy));
        let mut back = vec![0u8; 32];
        m.read_runs(
            &[RowRun {
                page: 11,
                offset: 0,
                len: 4,
            }],
            &mut back,
        )
        .unwrap();
        assert_eq!(back, src);
        // Writing the copy leaves the original alone (copy-on-write).
        m.write_runs(
            &[RowRun {
                page: 11,
                offset: 3,
                len: 1,
            }],
            &[9u8; 8],
        )
        .unwrap();
        m.read_runs(
            &[RowRun {
                page: 5,
                offset: 0,
                len: 4,
            }],
            &mut back,
        )
        .unwrap();
        assert_eq!(back, src);
        assert_eq!(m.copy_page(5, 5).unwrap().bytes, 0);
        assert!(matches!(
            m.copy_page(5, 16),
            Err(MemoryError::PageOutOfRange {
                page: 16,
                page_count: 16
            })
        ));
    }

    #[test]
    fn host_rejects_bad_runs_without_writing() {
        let mut m = memory();
        let runs = [
            RowRun {
                page: 1,
                offset: 0,
                len: 1,
            },
            RowRun {
                page: 99,
                offset: 0,
                len: 1,
            },
        ];
        assert!(m.write_runs(&runs, &[5u8; 16]).is_err());
        let mut back = vec![7u8; 8];
        m.read_runs(&runs[..1], &mut back).unwrap();
        assert_eq!(back, vec![0u8; 8]);
        assert_eq!(m.totals().upload.count, 0);
        assert!(m.describe().starts_with("host: 16 pages"));
    }
}
