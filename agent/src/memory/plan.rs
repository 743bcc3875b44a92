//! Turning row runs into copy commands: validation, merging of contiguous runs, and
//! splitting into staging-sized batches. Shared by every backend so that they validate
//! identically.

use crate::memory::{ArenaGeometry, MemoryError, RowRun};

/// One contiguous copy between the host buffer and the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOp {
    /// Byte offset in the arena.
    pub arena_offset: u64,
    /// Byte offset in the caller's host buffer.
    pub buffer_offset: usize,
    /// Bytes to copy.
    pub len: usize,
}

/// A host buffer in pieces: the rows are the pieces one after another. A restore hands
/// the chunks it gathered straight from their payloads, so no backend needs a joined copy
/// (the GPU's staging and the host arena each take the bytes where they lie).
#[derive(Debug, Clone, Copy)]
pub struct Gathered<'a>(pub &'a [&'a [u8]]);

impl Gathered<'_> {
    /// Bytes in all the pieces.
    pub fn len(&self) -> usize {
        self.0.iter().map(|p| p.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `dst` from the bytes at `offset..offset + dst.len()` of the pieces together;
    /// false, with `dst` partly filled, when that range runs past their end.
    pub fn copy_to(&self, mut offset: usize, mut dst: &mut [u8]) -> bool {
        for piece in self.0 {
            if dst.is_empty() {
                break;
            }
            let Some(from) = piece.get(offset..) else {
                offset -= piece.len();
                continue;
            };
            let n = from.len().min(dst.len());
            let (to, rest) = dst.split_at_mut(n);
            to.copy_from_slice(&from[..n]);
            dst = rest;
            offset = 0;
        }
        dst.is_empty()
    }
}

/// Validates `runs` against the geometry and a host buffer of `buffer_len` bytes and
/// returns the copies, with neighbours merged when they are contiguous both in the buffer
/// (always true for consecutive runs) and in the arena (the previous run ends exactly
/// where the next begins, e.g. the end of page 4 and the start of page 5).
pub fn plan_copies(
    geometry: &ArenaGeometry,
    runs: &[RowRun],
    buffer_len: usize,
) -> Result<Vec<CopyOp>, MemoryError> {
    let mut copies: Vec<CopyOp> = Vec::with_capacity(runs.len());
    let mut buffer_offset: u64 = 0;
    for run in runs {
        if run.page >= geometry.page_count {
            return Err(MemoryError::PageOutOfRange {
                page: run.page,
                page_count: geometry.page_count,
            });
        }
        let end = run.offset as u64 + run.len as u64;
        if end > geometry.page_size as u64 {
            return Err(MemoryError::RunPastPage {
                page: run.page,
                offset: run.offset,
                end,
                page_size: geometry.page_size,
            });
        }
        if run.len == 0 {
            continue;
        }
        let len = geometry.rows_bytes(run.len as u64);
        let arena_offset = geometry.offset_of(run.page, run.offset);
        // The arena size was checked to fit isize in `ArenaGeometry::new`, and a run lies
        // inside the arena, so every length and offset fits usize.
        let (Ok(len_usize), Ok(buf_usize)) = (usize::try_from(len), usize::try_from(buffer_offset))
        else {
            return Err(MemoryError::BufferSize {
                expected: buffer_offset.saturating_add(len),
                got: buffer_len as u64,
            });
        };
        match copies.last_mut() {
            Some(last) if last.arena_offset + last.len as u64 == arena_offset => {
                last.len += len_usize;
            }
            _ => copies.push(CopyOp {
                arena_offset,
                buffer_offset: buf_usize,
                len: len_usize,
            }),
        }
        buffer_offset += len;
    }
    if buffer_offset != buffer_len as u64 {
        return Err(MemoryError::BufferSize {
            expected: buffer_offset,
            got: buffer_len as u64,
        });
    }
    Ok(copies)
}

/// Splits copies into batches of at most `capacity` bytes each (the staging buffer), in
/// order; a copy larger than `capacity` is cut into several. A zero capacity is treated
/// as 1 byte.
pub fn split_batches(copies: &[CopyOp], capacity: usize) -> Vec<Vec<CopyOp>> {
    let capacity = capacity.max(1);
    let mut batches: Vec<Vec<CopyOp>> = Vec::new();
    let mut current: Vec<CopyOp> = Vec::new();
    let mut used = 0usize;
    for copy in copies {
        let mut c = *copy;
        while c.len > 0 {
            if used == capacity {
                batches.push(std::mem::take(&mut current));
                used = 0;
            }
            let take = c.len.min(capacity - used);
            current.push(CopyOp {
                arena_offset: c.arena_offset,
                buffer_offset: c.buffer_offset,
                len: take,
            });
            used += take;
            c.arena_offset += take as u64;
            c.buffer_offset += take;
            c.len -= take;
        }
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_ranges_cross_pieces_and_stop_at_the_end() {
        let (a, b, c): (&[u8], &[u8], &[u8]) = (&[1, 2, 3], &[], &[4, 5, 6, 7]);
        let g = Gathered(&[a, b, c]);
        assert_eq!(g.len(), 7);
        let mut dst = [0u8; 4];
        assert!(g.copy_to(1, &mut dst));
        assert_eq!(dst, [2, 3, 4, 5]);
        let mut dst = [0u8; 2];
        assert!(g.copy_to(5, &mut dst));
        assert_eq!(dst, [6, 7]);
        let mut dst = [0u8; 3];
        assert!(!g.copy_to(5, &mut dst), "two bytes left, three asked");
        assert!(g.copy_to(7, &mut []));
        assert!(!g.copy_to(8, &mut [0]));
    }

    fn g() -> ArenaGeometry {
        ArenaGeometry::new(4, 8, 10).unwrap()
    }

    #[test]
    fn contiguous_pages_merge_into_one_copy() {
        // Rows 2..4 of page 1, all of page 2, rows 0..1 of page 3: one arena range.
        let runs = [
            RowRun {
                page: 1,
                offset: 2,
                len: 2,
            },
            RowRun {
                page: 2,
                offset: 0,
                len: 4,
            },
            RowRun {
                page: 3,
                offset: 0,
                len: 1,
            },
        ];
        let copies = plan_copies(&g(), &runs, 70).unwrap();
        assert_eq!(
            copies,
            vec![CopyOp {
                arena_offset: 60,
                buffer_offset: 0,
                len: 70
            }]
        );
    }

    #[test]
    fn scattered_pages_stay_separate_and_zero_runs_vanish() {
        let runs = [
            RowRun {
                page: 5,
                offset: 0,
                len: 4,
            },
            RowRun {
                page: 0,
                offset: 0,
                len: 0,
            },
            RowRun {
                page: 2,
                offset: 1,
                len: 2,
            },
        ];
        let copies = plan_copies(&g(), &runs, 60).unwrap();
        assert_eq!(
            copies,
            vec![
                CopyOp {
                    arena_offset: 200,
                    buffer_offset: 0,
                    len: 40
                },
                CopyOp {
                    arena_offset: 90,
                    buffer_offset: 40,
                    len: 20
                },
            ]
        );
    }

    #[test]
    fn bad_runs_and_buffers_are_typed_errors() {
        let bad_page = [RowRun {
            page: 8,
            offset: 0,
            len: 1,
        }];
        assert!(matches!(
            plan_copies(&g(), &bad_page, 10),
            Err(MemoryError::PageOutOfRange {
                page: 8,
                page_count: 8
            })
        ));
        let past = [RowRun {
            page: 1,
            offset: 3,
            len: 2,
        }];
        assert!(matches!(
            plan_copies(&g(), &past, 20),
            Err(MemoryError::RunPastPage { end: 5, .. })
        ));
        let ok = [RowRun {
            page: 1,
            offset: 0,
            len: 2,
        }];
        assert!(matches!(
            plan_copies(&g(), &ok, 19),
            Err(MemoryError::BufferSize {
                expected: 20,
                got: 19
            })
        ));
    }

    #[test]
    fn batches_respect_capacity_and_cover_every_byte_once() {
        let copies = [
            CopyOp {
                arena_offset: 0,
                buffer_offset: 0,
                len: 25,
            },
            CopyOp {
                arena_offset: 100,
                buffer_offset: 25,
                len: 5,
            },
            CopyOp {
                arena_offset: 300,
                buffer_offset: 30,
                len: 12,
            },
        ];
        let batches = split_batches(&copies, 10);
        assert!(
            batches
                .iter()
                .all(|b| b.iter().map(|c| c.len).sum::<usize>() <= 10)
        );
        let flat: Vec<CopyOp> = batches.concat();
        assert_eq!(flat.iter().map(|c| c.len).sum::<usize>(), 42);
        // Buffer offsets are consecutive and arena offsets follow their source copy.
        let mut next = 0;
        for c in &flat {
            assert_eq!(c.buffer_offset, next);
            next += c.len;
        }
        assert_eq!(
            flat[0],
            CopyOp {
                arena_offset: 0,
                buffer_offset: 0,
                len: 10
            }
        );
        assert_eq!(
            flat[2],
            CopyOp {
                arena_offset: 20,
                buffer_offset: 20,
                len: 5
            }
        );
        assert_eq!(
            flat[3],
            CopyOp {
                arena_offset: 100,
                buffer_offset: 25,
                len: 5
            }
        );
        assert!(split_batches(&[], 10).is_empty());
    }
}
