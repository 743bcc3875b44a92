//! One worker's block cache across GPU, host RAM and local SSD.
//!
//! Blocks are the trace's 512-token prefix blocks, by dense index ([`Workload`]). Each
//! tier keeps its *unpinned* blocks in an intrusive LRU list (vLLM's free-block queue,
//! `anchors.md` §4): pinning a block takes it off the list, so eviction is a pop from the
//! cold end and never walks past blocks in use. Tiers are inclusive copies: a block
//! promoted from SSD to GPU keeps its SSD copy, so evicting it again costs nothing.
//! Eviction is offload-on-evict: GPU → RAM → SSD → dropped. Every move is counted.
//!
//! [`Workload`]: super::trace::Workload

use serde::{Deserialize, Serialize};

const NIL: u32 = u32::MAX;

/// A cache tier of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Gpu,
    Ram,
    Ssd,
}

impl Level {
    fn bit(self) -> u8 {
        match self {
            Level::Gpu => 1,
            Level::Ram => 2,
            Level::Ssd => 4,
        }
    }
}

/// Blocks and bytes that moved between tiers, and evictions, over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierTraffic {
    /// GPU → RAM offloads on eviction.
    pub gpu_to_ram_bytes: u64,
    /// RAM → SSD demotions on eviction.
    pub ram_to_ssd_bytes: u64,
    /// RAM → GPU restores.
    pub ram_to_gpu_bytes: u64,
    /// SSD → RAM reads.
    pub ssd_read_bytes: u64,
    /// Object store → RAM reads.
    pub object_read_bytes: u64,
    /// Uploads to the object store.
    pub object_write_bytes: u64,
    pub gpu_evictions: u64,
    pub ram_evictions: u64,
    pub ssd_evictions: u64,
}

impl TierTraffic {
    pub fn add(&mut self, o: &TierTraffic) {
        self.gpu_to_ram_bytes += o.gpu_to_ram_bytes;
        self.ram_to_ssd_bytes += o.ram_to_ssd_bytes;
        self.ram_to_gpu_bytes += o.ram_to_gpu_bytes;
        self.ssd_read_bytes += o.ssd_read_bytes;
        self.object_read_bytes += o.object_read_bytes;
        self.object_write_bytes += o.object_write_bytes;
        self.gpu_evictions += o.gpu_evictions;
        self.ram_evictions += o.ram_evictions;
        self.ssd_evictions += o.ssd_evictions;
    }
}

/// The three tiers of one worker. Capacities are in blocks.
#[derive(Debug, Clone)]
pub struct BlockCache {
    flags: Vec<u8>,
    gpu: Tier,
    ram: Tier,
    ssd: Tier,
    pub traffic: TierTraffic,
}

impl BlockCache {
    /// An empty cache over `blocks` possible block indices.
    pub fn new(blocks: usize, gpu: u32, ram: u32, ssd: u32) -> BlockCache {
        BlockCache {
            flags: vec![0; blocks],
            gpu: Tier::new(blocks, gpu, true),
            ram: Tier::new(blocks, ram, true),
            ssd: Tier::new(blocks, ssd, false),
            traffic: TierTraffic::default(),
        }
    }

    pub fn has(&self, level: Level, b: u32) -> bool {
        self.flags
            .get(b as usize)
            .is_some_and(|f| f & level.bit() != 0)
    }

    /// The fastest tier holding `b`.
    pub fn best(&self, b: u32) -> Option<Level> {
        let f = self.flags.get(b as usize).copied().unwrap_or(0);
        if f & 1 != 0 {
            Some(Level::Gpu)
        } else if f & 2 != 0 {
            Some(Level::Ram)
        } else if f & 4 != 0 {
            Some(Level::Ssd)
        } else {
            None
        }
    }

    /// Leading blocks of `chain` resident on the GPU.
    pub fn gpu_prefix(&self, chain: &[u32]) -> usize {
        chain
            .iter()
            .take_while(|&&b| self.has(Level::Gpu, b))
            .count()
    }

    /// Every block on the GPU, in index order (a scan of every block: for heartbeats).
    pub fn gpu_blocks(&self) -> Vec<u32> {
        (0u32..)
            .zip(&self.flags)
            .filter(|(_, f)| **f & Level::Gpu.bit() != 0)
            .map(|(b, _)| b)
            .collect()
    }

    /// Blocks on the GPU (pinned or not).
    pub fn gpu_len(&self) -> u32 {
        self.gpu.len
    }

    /// Unpinned GPU blocks: what admission may evict.
    pub fn gpu_evictable(&self) -> u32 {
        self.gpu.lru.len
    }

    pub fn ram_len(&self) -> u32 {
        self.ram.len
    }

    pub fn ram_capacity(&self) -> u32 {
        self.ram.capacity
    }

    pub fn ssd_len(&self) -> u32 {
        self.ssd.len
    }

    pub fn gpu_capacity(&self) -> u32 {
        self.gpu.capacity
    }

    /// Pins a block resident on `level` (GPU or RAM) against eviction.
    pub fn pin(&mut self, level: Level, b: u32) {
        if self.has(level, b) {
            self.tier_mut(level).pin(b);
        }
    }

    /// Releases one pin; the block becomes the most recently used when unpinned.
    pub fn unpin(&mut self, level: Level, b: u32) {
        if self.has(level, b) {
            self.tier_mut(level).unpin(b);
        }
    }

    /// Marks `b` most recently used on `level` if it is there and unpinned.
    pub fn touch(&mut self, level: Level, b: u32) {
        if self.has(level, b) {
            self.tier_mut(level).touch(b);
        }
    }

    /// Puts `b` on the GPU, pinned. The caller has made room ([`Self::evict_gpu`]); a
    /// block already there just gains a pin.
    pub fn insert_gpu_pinned(&mut self, b: u32) {
        if self.has(Level::Gpu, b) {
            self.gpu.pin(b);
            return;
        }
        self.set(Level::Gpu, b);
        self.gpu.len += 1;
        self.gpu.pins_add(b);
    }

    /// Evicts up to `n` unpinned GPU blocks, coldest first, offloading each to RAM
    /// unless RAM already has it. Returns how many were evicted.
    pub fn evict_gpu(&mut self, n: u32, bytes_of: &dyn Fn(u32) -> u64) -> u32 {
        let mut done = 0;
        while done < n {
            let Some(b) = self.gpu.lru.pop_cold() else {
                break;
            };
            self.clear(Level::Gpu, b);
            self.gpu.len -= 1;
            self.traffic.gpu_evictions += 1;
            if !self.has(Level::Ram, b) && self.insert_ram(b, bytes_of) {
                self.traffic.gpu_to_ram_bytes += bytes_of(b);
            }
            done += 1;
        }
        done
    }

    /// Puts a copy of `b` in RAM (most recently used), demoting RAM's coldest unpinned
    /// block to SSD if RAM is full. Returns false when RAM is full of pinned blocks.
    pub fn insert_ram(&mut self, b: u32, bytes_of: &dyn Fn(u32) -> u64) -> bool {
        if self.has(Level::Ram, b) {
            self.ram.touch(b);
            return true;
        }
        if self.ram.len >= self.ram.capacity {
            let Some(victim) = self.ram.lru.pop_cold() else {
                return false;
            };
            self.clear(Level::Ram, victim);
            self.ram.len -= 1;
            self.traffic.ram_evictions += 1;
            if !self.has(Level::Ssd, victim) {
                self.insert_ssd(victim);
                self.traffic.ram_to_ssd_bytes += bytes_of(victim);
            }
        }
        if self.ram.capacity == 0 {
            return false;
        }
        self.set(Level::Ram, b);
        self.ram.len += 1;
        self.ram.lru.push_hot(b);
        true
    }

    /// Puts a copy of `b` on SSD, dropping SSD's coldest block if full.
    pub fn insert_ssd(&mut self, b: u32) {
        if self.has(Level::Ssd, b) {
            self.ssd.touch(b);
            return;
        }
        if self.ssd.capacity == 0 {
            return;
        }
        if self.ssd.len >= self.ssd.capacity
            && let Some(victim) = self.ssd.lru.pop_cold()
        {
            self.clear(Level::Ssd, victim);
            self.ssd.len -= 1;
            self.traffic.ssd_evictions += 1;
        }
        self.set(Level::Ssd, b);
        self.ssd.len += 1;
        self.ssd.lru.push_hot(b);
    }

    fn tier_mut(&mut self, level: Level) -> &mut Tier {
        match level {
            Level::Gpu => &mut self.gpu,
            Level::Ram => &mut self.ram,
            Level::Ssd => &mut self.ssd,
        }
    }

    fn set(&mut self, level: Level, b: u32) {
        if let Some(f) = self.flags.get_mut(b as usize) {
            *f |= level.bit();
        }
    }

    fn clear(&mut self, level: Level, b: u32) {
        if let Some(f) = self.flags.get_mut(b as usize) {
            *f &= !level.bit();
        }
    }
}

/// One tier: capacity, resident count, pin counts and the LRU list of unpinned blocks.
#[derive(Debug, Clone)]
struct Tier {
    capacity: u32,
    len: u32,
    pins: Vec<u16>,
    lru: Lru,
}

impl Tier {
    fn new(blocks: usize, capacity: u32, pinnable: bool) -> Tier {
        Tier {
            capacity,
            len: 0,
            pins: if pinnable {
                vec![0; blocks]
            } else {
                Vec::new()
            },
            lru: Lru::new(blocks),
        }
    }

    fn pin_count(&self, b: u32) -> u16 {
        self.pins.get(b as usize).copied().unwrap_or(0)
    }

    fn pins_add(&mut self, b: u32) {
        if let Some(p) = self.pins.get_mut(b as usize) {
            *p = p.saturating_add(1);
        }
    }

    fn pin(&mut self, b: u32) {
        if self.pin_count(b) == 0 {
            self.lru.unlink(b);
        }
        self.pins_add(b);
    }

    fn unpin(&mut self, b: u32) {
        let Some(p) = self.pins.get_mut(b as usize) else {
            return;
        };
        if *p == 0 {
            return;
        }
        *p -= 1;
        if *p == 0 {
            self.lru.push_hot(b);
        }
    }

    fn touch(&mut self, b: u32) {
        if self.pin_count(b) == 0 {
            self.lru.unlink(b);
            self.lru.push_hot(b);
        }
    }
}

/// An intrusive doubly linked list over block indices: cold end first.
///
/// Invariant that makes the indexing in `push_hot` and `unlink` safe: `prev`, `next` and
/// `linked` always have the same length, and both methods check the index against
/// `linked` before indexing.
#[derive(Debug, Clone)]
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    cold: u32,
    hot: u32,
    len: u32,
}

impl Lru {
    fn new(blocks: usize) -> Lru {
        Lru {
            prev: vec![NIL; blocks],
            next: vec![NIL; blocks],
            linked: vec![false; blocks],
            cold: NIL,
            hot: NIL,
            len: 0,
        }
    }

    fn push_hot(&mut self, b: u32) {
        let i = b as usize;
        if self.linked.get(i).is_none_or(|l| *l) {
            return;
        }
        self.linked[i] = true;
        self.prev[i] = self.hot;
        self.next[i] = NIL;
        if let Some(n) = self.next.get_mut(self.hot as usize) {
            *n = b;
        } else {
            self.cold = b;
        }
        self.hot = b;
        self.len += 1;
    }

    fn unlink(&mut self, b: u32) {
        let i = b as usize;
        if !self.linked.get(i).is_some_and(|l| *l) {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        match self.next.get_mut(p as usize) {
            Some(slot) => *slot = n,
            None => self.cold = n,
        }
        match self.prev.get_mut(n as usize) {
            Some(slot) => *slot = p,
            None => self.hot = p,
        }
        self.linked[i] = false;
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.len -= 1;
    }

    fn pop_cold(&mut self) -> Option<u32> {
        if self.cold == NIL {
            return None;
        }
        let b = self.cold;
        self.unlink(b);
        Some(b)
    }
}
