//! Chunk scatter and dense page tables (spec §4.7, tests PP-3 and PP-4).
//!
//! A durable chunk covers tokens `[start, start + count)` of a route. Its rows land in
//! the route's physical pages as *runs*: one run per page touched, split at logical page
//! boundaries (a page holds rows for every layer and slab, so two pages are never one
//! contiguous range even when their numbers are adjacent). A chunk may start and end
//! mid-page and cross arbitrary physical pages.

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::error::PoolError;
use super::page::Page;
use crate::ids::RouteId;

/// Contiguous rows of one page: `tokens` rows from row `offset`, holding the chunk's
/// tokens `chunk_offset .. chunk_offset + tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub page: Page,
    pub offset: u32,
    pub tokens: u32,
    pub chunk_offset: u32,
}

/// The runs of tokens `[start, start + count)` over a route's `pages`. The range must
/// lie within the rows the pages hold.
pub fn scatter_runs(
    pages: &[Page],
    page_size: u32,
    start: u32,
    count: u32,
) -> Result<Vec<Run>, PoolError> {
    let ps = page_size.max(1);
    let limit = (pages.len() as u64) * ps as u64;
    let end = start as u64 + count as u64;
    if end > limit {
        return Err(PoolError::RangeOutside {
            start,
            count,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        });
    }
    let mut runs = Vec::new();
    let mut pos = start;
    let end = start + count; // ≤ limit ≤ u32 range: checked above.
    while pos < end {
        let logical = pos / ps;
        let offset = pos % ps;
        let tokens = (ps - offset).min(end - pos);
        // logical < pages.len() because pos < end ≤ pages.len() × ps.
        runs.push(Run {
            page: pages[logical as usize],
            offset,
            tokens,
            chunk_offset: pos - start,
        });
        pos += tokens;
    }
    Ok(runs)
}

/// Page tables of several routes as one dense row-major `i32` matrix (the layout
/// attention kernels take): row *r* lists route *r*'s pages, padded with −1 to `width`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageTable {
    pub width: u32,
    /// `rows × width` entries, row-major; −1 marks padding.
    pub pages: Vec<i32>,
    /// Token count of each row.
    pub lengths: Vec<u32>,
    /// Absolute position of each row's first token.
    pub start_positions: Vec<u32>,
}

impl PageTable {
    /// Build from `(pages, token count, start position)` rows; the width is the longest
    /// page list.
    pub fn from_rows<'a>(rows: impl Iterator<Item = (&'a [Page], u32, u32)> + Clone) -> PageTable {
        let width = rows.clone().map(|(p, _, _)| p.len()).max().unwrap_or(0);
        let mut table = PageTable {
            width: width as u32,
            pages: Vec::new(),
            lengths: Vec::new(),
            start_positions: Vec::new(),
        };
        for (pages, len, start) in rows {
            // Page numbers are < page_count ≤ i32::MAX (checked by `PagePool::new`).
            table.pages.extend(pages.iter().map(|p| p.0 as i32));
            table
                .pages
                .extend(std::iter::repeat_n(-1, width - pages.len()));
            table.lengths.push(len);
            table.start_positions.push(start);
        }
        table
    }

    pub fn rows(&self) -> usize {
        self.lengths.len()
    }

    /// Row `i` (empty when out of range).
    pub fn row(&self, i: usize) -> &[i32] {
        let w = self.width as usize;
        self.pages.get(i * w..(i + 1) * w).unwrap_or(&[])
    }
}

impl PagePool {
    /// The runs of a chunk `[start, start + count)` of `route`'s committed tokens.
    pub fn scatter(&self, route: &RouteId, start: u32, count: u32) -> Result<Vec<Run>, PoolError> {
        let r = self
            .routes
            .get(route)
            .ok_or_else(|| PoolError::UnknownRoute(route.clone()))?;
        if start as u64 + count as u64 > r.token_count as u64 {
            return Err(PoolError::RangeOutside {
                start,
                count,
                limit: r.token_count,
            });
        }
        scatter_runs(&r.pages, self.geometry.page_size, start, count)
    }

    /// The dense page table of the routes' committed snapshots, in the order named.
    pub fn page_table(&self, routes: &[RouteId]) -> Result<PageTable, PoolError> {
        let mut rows = Vec::with_capacity(routes.len());
        for id in routes {
            let r = self
                .routes
                .get(id)
                .ok_or_else(|| PoolError::UnknownRoute(id.clone()))?;
            rows.push((r.pages.as_slice(), r.token_count, r.start_position));
        }
        Ok(PageTable::from_rows(rows.into_iter()))
    }
}
