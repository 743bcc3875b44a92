//! What a simulated worker keeps of the KV it computes: its prompt blocks into the prefix
//! cache (and the object store), a completed route's chunks checkpointed into the RAM
//! tier (den's synthetic engine), and where a block can be reused from.

use super::{Shared, Source, Worker};
use crate::cache::{BlockCache, Level};
use crate::cost::Micros;

impl Worker {
    /// Synthetic engine: requests whose reused prefix already covers the processed prompt
    /// have nothing to prefill and go straight to their first-token row.
    pub(super) fn fill_reused(&mut self, now: Micros, sh: &mut Shared) {
        if sh.cost.synthetic.is_none() {
            return;
        }
        let filled: Vec<u32> = self
            .prefilling
            .iter()
            .copied()
            .filter(|&r| {
                let (Some(st), Some(req)) = (
                    sh.reqs.get(r as usize),
                    sh.workload.requests.get(r as usize),
                ) else {
                    return false;
                };
                st.ready <= now && st.prefilled >= sh.cost.prompt_rows(req.input_tokens)
            })
            .collect();
        for r in filled {
            let first_new = sh.reqs.get(r as usize).map_or(0, |st| st.reused_blocks) as usize;
            if let Some(st) = sh.reqs.get_mut(r as usize) {
                st.started.get_or_insert(now);
            }
            self.prefilling.retain(|&x| x != r);
            self.cache_computed(now, r, first_new, sh);
            self.firsts.push(r);
        }
    }

    /// Moves a request's freshly computed prompt blocks from its private allocation into
    /// the prefix cache (pinned until it completes) and uploads them to the object store.
    pub(super) fn cache_computed(
        &mut self,
        now: Micros,
        r: u32,
        first_new: usize,
        sh: &mut Shared,
    ) {
        let Some(req) = sh.workload.requests.get(r as usize) else {
            return;
        };
        let chain = sh.workload.blocks(req);
        let mut upload = 0u64;
        let mut uploaded = Vec::new();
        for &b in chain.iter().skip(first_new) {
            self.cache.insert_gpu_pinned(b);
            self.private_blocks = self.private_blocks.saturating_sub(1);
            let published = sh
                .published_at
                .get(b as usize)
                .is_some_and(|t| *t != Micros::MAX);
            if !published && sh.cost.object_store.is_some() {
                upload += sh.block_bytes(b);
                uploaded.push(b);
            }
        }
        if upload > 0 {
            let done = self
                .nic_up
                .reserve(now, sh.cost.object_us(upload).unwrap_or(0));
            for b in uploaded {
                if let Some(t) = sh.published_at.get_mut(b as usize) {
                    *t = done;
                }
            }
            self.cache.traffic.object_write_bytes += upload;
        }
    }

    /// Synthetic engine: den's worker checkpoints a completed route's computed chunks into
    /// its RAM tier (else SSD).
    pub(super) fn checkpoint(&mut self, r: u32, sh: &Shared) {
        let (Some(req), Some(st)) = (
            sh.workload.requests.get(r as usize),
            sh.reqs.get(r as usize),
        ) else {
            return;
        };
        let chain = sh.workload.blocks(req);
        let first_new = st.reused_blocks as usize;
        let bytes_of = |x: u32| sh.block_bytes(x);
        for &b in chain.iter().skip(first_new) {
            if self.cache.ram_capacity() > 0 {
                if !self.cache.has(Level::Ram, b) {
                    self.cache.traffic.gpu_to_ram_bytes += bytes_of(b);
                }
                self.cache.insert_ram(b, &bytes_of);
            } else {
                self.cache.insert_ssd(b);
            }
        }
    }
}

/// The fastest place block `b` can be reused from on a worker, at `now`.
pub(crate) fn durable_source_of(
    cache: &BlockCache,
    published_at: &[Micros],
    now: Micros,
    b: u32,
) -> Option<Source> {
    if cache.has(Level::Ram, b) {
        Some(Source::Ram)
    } else if cache.has(Level::Ssd, b) {
        Some(Source::Ssd)
    } else if published_at.get(b as usize).is_some_and(|t| *t <= now) {
        Some(Source::Object)
    } else {
        None
    }
}

pub(crate) fn source_of(
    cache: &BlockCache,
    published_at: &[Micros],
    now: Micros,
    b: u32,
) -> Option<Source> {
    match cache.best(b) {
        Some(Level::Gpu) => Some(Source::Gpu),
        Some(Level::Ram) => Some(Source::Ram),
        Some(Level::Ssd) => Some(Source::Ssd),
        None if published_at.get(b as usize).is_some_and(|t| *t <= now) => Some(Source::Object),
        None => None,
    }
}
