//! A restore's chunks fetched from the tiers off the device thread (spec §3.9, §4.7).
//!
//! The device thread only scatters bytes into pages; reading a chunk (a RAM copy checked
//! by SHA-256, an SSD map, an object-store round trip) happens here, on the runtime, with
//! [`RESTORE_FETCH_WINDOW`] fetches of one restore in flight and the results delivered in
//! chain order. So a remote store's latency overlaps the other fetches instead of adding
//! up chunk after chunk (the router prices restores the same way), hashing runs on every
//! core, and decode steps of other requests go on while a restore waits for its bytes.
//!
//! At most [`RESTORE_FETCH_WINDOW`] chunks of a restore are held at once, fetching or
//! fetched and waiting for the device: each carries a permit the device releases when it
//! has scattered (or dropped) the chunk, so a long restore behind busy steps never piles
//! its whole prefix up in memory.
//!
//! The fetch stops at the first chunk no tier has intact (the rest of the prefix is then
//! recomputed), when its assignment is cancelled, or when the actor stops listening. Each
//! chunk comes from the fastest tier holding an intact copy of exactly that chunk (ram,
//! then ssd, then object); missing and corrupt replicas are reported so the catalog
//! forgets them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use den_protocol::calibration::Ewma;
use den_protocol::candidate::Tier;
use den_protocol::chunk::{ChunkDescriptor, RESTORE_FETCH_WINDOW, plan_chunks};
use den_protocol::ids::ModelFingerprint;
use den_protocol::request::GenerationRequest;

use crate::metrics::Metrics;
use crate::tiers::{Chunk, ChunkKey, TierError};
use crate::worker::device::DeviceEvent;
use crate::worker::faults::Faults;
use crate::worker::store::{BadReplica, Tiers};

/// One chunk of a restore, read and verified. Dropping it frees a place in its
/// restore's window.
#[derive(Debug)]
pub struct Fetched {
    pub descriptor: ChunkDescriptor,
    pub tier: Tier,
    pub chunk: Chunk,
    _held: OwnedSemaphorePermit,
}

/// What a fetch needs of the worker.
#[derive(Clone)]
pub struct FetchContext {
    pub tiers: Tiers,
    pub metrics: Arc<Metrics>,
    /// Where bad replicas are reported (the actor's device-event channel).
    pub events: mpsc::UnboundedSender<DeviceEvent>,
    pub faults: Arc<Faults>,
    pub row_bytes: u64,
    pub meter: Arc<FetchMeter>,
}

/// Chunk fetches of restores in flight on this worker, and the most there have been at
/// once (`den_restore_fetches_in_flight`, `den_restore_fetches_in_flight_peak`); and the
/// bytes restores still have to fetch, by the tier their assignment loads from: what the
/// heartbeat reports as each tier's link backlog, so the router prices a new load from a
/// tier behind the restores already reading it.
#[derive(Debug, Default)]
pub struct FetchMeter {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Bytes to fetch, by [`LINK_TIERS`] index.
    pending: [AtomicU64; 3],
    /// What restores measured of each tier's link, by [`LINK_TIERS`] index.
    fits: Mutex<[LinkFit; 3]>,
}

/// What restores measured of one tier's link, for the heartbeat: the rate chunks
/// arrive at once the first is in (the window keeps the link busy, so this is the
/// link's rate as a restore sees it, not one fetch's), and the time to the first chunk
/// beyond its own bytes (the latency a restore pays once before the bytes stream). Per
/// fetch samples cannot tell the two apart (every chunk is the same size), and with
/// [`RESTORE_FETCH_WINDOW`] fetches sharing the link one fetch's time is mostly the
/// others'.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkFit {
    pub bytes_per_ms: Ewma,
    pub fixed_ms: Ewma,
}

/// One restore's arrivals — each delivered chunk's (ms since the fetch began, bytes), in
/// chain order — as (streaming rate in bytes/ms when the chunks after the first took
/// measurable time, latency in ms). `None` for fewer than two chunks.
pub fn fit_restore(arrivals: &[(f64, u64)]) -> Option<(Option<f64>, f64)> {
    let (&(first_ms, first_bytes), rest) = arrivals.split_first()?;
    let &(last_ms, _) = rest.last()?;
    let streamed: u64 = rest.iter().map(|a| a.1).sum();
    let span = last_ms - first_ms;
    // Below a microsecond the chunks after the first came at once: the link was not
    // what they waited for, so there is no rate to learn, only the latency.
    let rate = (span > 1e-3 && streamed > 0).then(|| streamed as f64 / span);
    let own = rate.map_or(0.0, |r| first_bytes as f64 / r);
    Some((rate, (first_ms - own).max(0.0)))
}

/// The tiers a restore reads from, in [`FetchMeter`]'s order.
const LINK_TIERS: [Tier; 3] = [Tier::Ram, Tier::Ssd, Tier::Object];

/// `tier`'s place in [`LINK_TIERS`] (`None`: not a tier restores read from).
fn slot(tier: Tier) -> Option<usize> {
    LINK_TIERS.iter().position(|t| *t == tier)
}

/// A restore's bytes still to fetch, counted in its meter until fetched or given up.
struct Booked<'a> {
    meter: &'a FetchMeter,
    slot: usize,
    left: u64,
}

impl Booked<'_> {
    fn fetched(&mut self, bytes: u64) {
        let n = bytes.min(self.left);
        self.left -= n;
        self.meter.pending[self.slot].fetch_sub(n, Ordering::Relaxed);
    }
}

impl Drop for Booked<'_> {
    fn drop(&mut self) {
        self.meter.pending[self.slot].fetch_sub(self.left, Ordering::Relaxed);
    }
}

impl FetchMeter {
    /// What restores measured of `tier`'s link (ram, ssd or object).
    pub fn link_fit(&self, tier: Tier) -> LinkFit {
        let fits = self.fits.lock().unwrap_or_else(|p| p.into_inner());
        slot(tier)
            .and_then(|i| fits.get(i).copied())
            .unwrap_or_default()
    }

    fn learn(&self, tier: Tier, arrivals: &[(f64, u64)]) {
        let (Some(i), Some((rate, fixed))) = (slot(tier), fit_restore(arrivals)) else {
            return;
        };
        let mut fits = self.fits.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = fits.get_mut(i) {
            if let Some(r) = rate {
                f.bytes_per_ms.observe(r);
            }
            f.fixed_ms.observe(fixed);
        }
    }

    /// Bytes restores have yet to fetch from `tier` (ram, ssd or object).
    pub fn pending_bytes(&self, tier: Tier) -> u64 {
        slot(tier).map_or(0, |i| self.pending[i].load(Ordering::Relaxed))
    }

    /// Books `bytes` on `tier`'s link (a durable tier; anything else counts as RAM).
    fn book(&self, tier: Tier, bytes: u64) -> Booked<'_> {
        let slot = slot(tier).unwrap_or(0);
        self.pending[slot].fetch_add(bytes, Ordering::Relaxed);
        Booked {
            meter: self,
            slot,
            left: bytes,
        }
    }

    fn begin(&self, metrics: &Metrics) {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        let peak = self.peak.fetch_max(now, Ordering::Relaxed).max(now);
        self.export(metrics, now, peak);
    }

    fn end(&self, metrics: &Metrics) {
        let now = self
            .in_flight
            .fetch_sub(1, Ordering::Relaxed)
            .saturating_sub(1);
        self.export(metrics, now, self.peak.load(Ordering::Relaxed));
    }

    fn export(&self, metrics: &Metrics, now: usize, peak: usize) {
        metrics.gauge_set(
            "den_restore_fetches_in_flight",
            "Chunk fetches of restores in flight now.",
            &[],
            now as f64,
        );
        metrics.gauge_set(
            "den_restore_fetches_in_flight_peak",
            "The most chunk fetches of restores in flight at once since the worker started.",
            &[],
            peak as f64,
        );
    }
}

/// The chunks a restore of `request` up to `cap` cached tokens reads when its route
/// already holds `held` tokens: the chain from the chunk starting at `held` to the
/// cached boundary. Empty when no chunk starts there (a resident head that ends inside a
/// chunk: nothing to append to it exactly).
pub fn restore_chunks(
    request: &GenerationRequest,
    cap: u32,
    held: u32,
    chunk_size: u32,
) -> Vec<ChunkDescriptor> {
    let plan = plan_chunks(request.processed_tokens(), chunk_size);
    let wanted: Vec<ChunkDescriptor> = plan
        .into_iter()
        .filter(|d| d.end() > held && d.end() <= cap)
        .collect();
    match wanted.first() {
        Some(d) if d.start == held => wanted,
        _ => Vec::new(),
    }
}

/// Fetches `chunks` in order with a window of concurrent reads and hands each to
/// `deliver`, stopping at the first chunk that cannot be had, once `stop()` says so, or
/// when `deliver` returns false. Until each chunk is fetched its bytes count in the
/// meter's backlog of `tier`, the tier the restore's assignment loads from; when the
/// restore read every chunk from that tier, what its arrivals show of the link is
/// learned ([`LinkFit`]).
pub async fn fetch_in_order(
    cx: &FetchContext,
    model: &ModelFingerprint,
    tier: Tier,
    chunks: Vec<ChunkDescriptor>,
    stop: impl Fn() -> bool,
    mut deliver: impl FnMut(Fetched) -> bool,
) {
    let bytes = |d: &ChunkDescriptor| u64::from(d.token_count).saturating_mul(cx.row_bytes);
    let mut booked = cx.meter.book(tier, chunks.iter().map(bytes).sum());
    let started = Instant::now();
    let mut arrivals: Vec<(f64, u64)> = Vec::with_capacity(chunks.len());
    let mut one_tier = true;
    // Permits are taken in chain order (the semaphore is fair), so the chunk the device
    // waits for next always has one.
    let window = Arc::new(Semaphore::new(RESTORE_FETCH_WINDOW));
    let mut stream = futures_util::stream::iter(chunks)
        .map(|d| {
            let window = Arc::clone(&window);
            async move {
                let held = window.acquire_owned().await.ok()?;
                let (tier, chunk) = fetch_one(cx, model, &d).await?;
                Some(Fetched {
                    descriptor: d,
                    tier,
                    chunk,
                    _held: held,
                })
            }
        })
        .buffered(RESTORE_FETCH_WINDOW);
    // A cancelled assignment must not wait for a slow store: ask while waiting.
    let mut poll = tokio::time::interval(Duration::from_millis(10));
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            _ = poll.tick() => {
                if stop() {
                    break;
                }
                continue;
            }
        };
        let Some(Some(fetched)) = next else {
            break;
        };
        let n = bytes(&fetched.descriptor);
        booked.fetched(n);
        arrivals.push((started.elapsed().as_secs_f64() * 1e3, n));
        one_tier &= fetched.tier == tier;
        if stop() || !deliver(fetched) {
            break;
        }
    }
    if one_tier {
        cx.meter.learn(tier, &arrivals);
    }
}

/// The chunk `d` of `model` from the fastest tier with an intact copy of exactly that
/// chunk; missing and corrupt replicas are reported.
async fn fetch_one(
    cx: &FetchContext,
    model: &ModelFingerprint,
    d: &ChunkDescriptor,
) -> Option<(Tier, Chunk)> {
    cx.meter.begin(&cx.metrics);
    let got = fetch_from_tiers(cx, model, d).await;
    cx.meter.end(&cx.metrics);
    got
}

async fn fetch_from_tiers(
    cx: &FetchContext,
    model: &ModelFingerprint,
    d: &ChunkDescriptor,
) -> Option<(Tier, Chunk)> {
    let key = ChunkKey::of(model, d.hash);
    let delay = cx.faults.fetch_delay_ms();
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    for (tier, store) in cx.tiers.ordered() {
        match store.get(key).await {
            Ok(chunk) if chunk.meta.matches(d) && chunk.meta.row_bytes == cx.row_bytes => {
                return Some((tier, chunk));
            }
            Ok(chunk) => {
                tracing::warn!(
                    tier = tier.as_str(),
                    chunk = %d.hash,
                    "stored chunk has another place in the chain or another row size ({} rows from {}, {} bytes per row); recomputing",
                    chunk.meta.token_count,
                    chunk.meta.start,
                    chunk.meta.row_bytes
                );
                let bad = BadReplica::corrupt(model, d.hash, tier);
                let _ = cx.events.send(DeviceEvent::BadReplica(bad));
            }
            Err(e) => {
                if e.means_recompute() {
                    if let Some(bad) = BadReplica::from_error(&e, key, model, d.hash, tier) {
                        if bad.corrupt {
                            tracing::warn!(tier = tier.as_str(), "{e}");
                        }
                        let _ = cx.events.send(DeviceEvent::BadReplica(bad));
                    }
                } else {
                    tracing::warn!(tier = tier.as_str(), "restore fetch failed: {e}");
                }
                let kind = match &e {
                    TierError::Missing { .. } => "missing",
                    TierError::Corrupt { .. } => "corrupt",
                    _ => "error",
                };
                cx.metrics.counter_add(
                    "den_restore_fetch_failures_total",
                    "Chunk fetches during restores that found no usable copy in a tier.",
                    &[("tier", tier.as_str()), ("kind", kind)],
                    1.0,
                );
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::test_support::run;
    use crate::tiers::{ChunkMeta, ChunkStore, RamTier};

    /// A request of `chunks` chunks of 4 tokens, and a RAM tier holding the first `n`.
    async fn stored(
        chunks: usize,
        n: usize,
        row_bytes: u64,
    ) -> (GenerationRequest, Tiers, Vec<ChunkDescriptor>) {
        let tokens = (chunks * 4 + 1) as u32;
        let request = GenerationRequest::new("r", "m", (1..=tokens).collect(), 1).unwrap();
        let ram = Arc::new(RamTier::new(1 << 30));
        let plan = plan_chunks(request.processed_tokens(), 4);
        for d in &plan[..n] {
            let meta = ChunkMeta::for_descriptor(&request.model, d, row_bytes);
            let payload = vec![7u8; meta.payload_bytes() as usize];
            ram.put(&Chunk::new(meta, payload).unwrap()).await.unwrap();
        }
        let tiers = Tiers {
            ram: Some(ram),
            ..Tiers::default()
        };
        (request, tiers, plan)
    }

    fn context(tiers: Tiers, row_bytes: u64) -> FetchContext {
        FetchContext {
            tiers,
            metrics: Arc::new(Metrics::new()),
            events: mpsc::unbounded_channel().0,
            faults: Arc::default(),
            row_bytes,
            meter: Arc::default(),
        }
    }

    #[test]
    fn chunks_come_in_chain_order_and_stop_at_the_first_missing_one() {
        run(async {
            let (request, tiers, plan) = stored(12, 10, 8).await;
            let cx = context(tiers, 8);
            let mut got = Vec::new();
            let mut backlog = Vec::new();
            // Twelve asked for, ten stored: the chain stops at the eleventh.
            fetch_in_order(
                &cx,
                &request.model,
                Tier::Ssd,
                plan,
                || false,
                |f| {
                    got.push(f.descriptor.start);
                    backlog.push(cx.meter.pending_bytes(Tier::Ssd));
                    true
                },
            )
            .await;
            assert_eq!(got, (0..10).map(|i| i * 4).collect::<Vec<u32>>());
            // 32 bytes a chunk (4 tokens × 8): the chunks not fetched yet are the SSD
            // link's backlog, and nothing is left booked once the fetch ends.
            let want: Vec<u64> = (1..=10).map(|i| (12 - i) * 32).collect();
            assert_eq!(backlog, want);
            assert_eq!(cx.meter.pending_bytes(Tier::Ssd), 0);
            assert_eq!(cx.meter.pending_bytes(Tier::Ram), 0);
        });
    }

    #[test]
    fn a_restore_holds_at_most_a_window_of_chunks_the_device_has_not_placed() {
        // The device keeps every chunk it was handed (as if busy with steps): the fetch
        // stops after a window's worth instead of reading the whole prefix into memory,
        // and goes on once the device lets chunks go.
        run(async {
            let n = RESTORE_FETCH_WINDOW + 8;
            let (request, tiers, plan) = stored(n, n, 8).await;
            let cx = context(tiers, 8);
            let held = std::sync::Mutex::new(Vec::new());
            let fetch = fetch_in_order(
                &cx,
                &request.model,
                Tier::Ram,
                plan.clone(),
                || false,
                |f| {
                    held.lock().unwrap().push(f);
                    true
                },
            );
            let r = tokio::time::timeout(Duration::from_millis(300), fetch).await;
            assert!(
                r.is_err(),
                "the fetch finished without the device placing a chunk"
            );
            assert_eq!(held.lock().unwrap().len(), RESTORE_FETCH_WINDOW);
            // Placed as they come: the rest follows.
            let mut placed = 0;
            fetch_in_order(
                &cx,
                &request.model,
                Tier::Ram,
                plan,
                || false,
                |f| {
                    drop(f);
                    placed += 1;
                    true
                },
            )
            .await;
            assert_eq!(placed, n);
        });
    }

    #[test]
    fn a_restores_arrivals_give_the_links_streaming_rate_and_its_latency() {
        // 30 ms before the first byte, then 10 bytes/ms: 100-byte chunks arrive at 40, 50,
        // 60 ms.
        let (rate, fixed) = fit_restore(&[(40.0, 100), (50.0, 100), (60.0, 100)]).unwrap();
        assert_eq!(rate, Some(10.0));
        assert!((fixed - 30.0).abs() < 1e-9, "{fixed}");
        // Everything at once after 300 ms: a latency, and no rate to learn.
        assert_eq!(
            fit_restore(&[(300.0, 10), (300.0, 10)]),
            Some((None, 300.0))
        );
        // One chunk cannot tell latency from bytes.
        assert_eq!(fit_restore(&[(5.0, 10)]), None);
        assert_eq!(fit_restore(&[]), None);
    }

    #[test]
    fn a_restore_reads_the_chain_from_what_the_route_holds_to_the_cached_boundary() {
        // 41 tokens, 40 processed, chunks of 8: five chunks; 32 cached.
        let r = GenerationRequest::new("r", "m", (1..=41).collect(), 1).unwrap();
        let from = |held| -> Vec<u32> {
            restore_chunks(&r, 32, held, 8)
                .iter()
                .map(|d| d.start)
                .collect()
        };
        assert_eq!(from(0), [0, 8, 16, 24]);
        // A forked resident head of two chunks: only the tail.
        assert_eq!(from(16), [16, 24]);
        // A head that ends inside a chunk: nothing can be appended to it exactly.
        assert_eq!(from(12), Vec::<u32>::new());
        assert_eq!(from(32), Vec::<u32>::new());
    }
}
