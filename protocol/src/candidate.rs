//! Candidates and their estimates (spec §1.3, §2.5).
//!
//! A candidate is one *(worker, cache alternative)* pair for one request: "serve this
//! request on worker W, reusing `cached_token_count` tokens from tier T". The router ranks
//! candidates by predicted time to first token; the worker re-runs the same estimate on
//! the candidate carried in an offer, because the router's view can be stale. Which
//! candidates a request has is [`crate::candidate_generation`]'s business.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, RouteId, WorkerId};
use crate::request::GenerationRequest;

/// Where a cached prefix lives. `None` means recompute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Gpu,
    Ram,
    Ssd,
    Peer,
    Object,
    None,
}

impl Tier {
    pub const ALL: [Tier; 6] = [
        Tier::Gpu,
        Tier::Ram,
        Tier::Ssd,
        Tier::Peer,
        Tier::Object,
        Tier::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Ram => "ram",
            Tier::Ssd => "ssd",
            Tier::Peer => "peer",
            Tier::Object => "object",
            Tier::None => "none",
        }
    }

    /// Rank among lower (durable) tiers: ram < ssd < object. Used to label a multi-tier
    /// prefix by its slowest tier and to break per-chunk source ties.
    pub fn lower_rank(self) -> u8 {
        match self {
            Tier::Gpu => 0,
            Tier::Ram => 1,
            Tier::Ssd => 2,
            Tier::Peer => 3,
            Tier::Object => 4,
            Tier::None => 5,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Transfer capabilities a worker reports. Observability only: they never discount an
/// estimate without measured evidence (spec §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TransferCapabilities {
    #[serde(default)]
    pub live_overlap_eligible: bool,
}

/// One (worker, cache alternative) pair for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub worker_id: WorkerId,
    pub worker_epoch: Epoch,
    pub tier: Tier,
    /// Exact prefix tokens available (excludes the pending token).
    pub cached_token_count: u32,
    pub cached_bytes: u64,
    pub queue_ms: f64,
    pub prefix_load_ms: f64,
    pub gpu_restore_ms: f64,
    pub prefill_ms_per_token: f64,
    pub first_token_ms: f64,
    pub page_size: u32,
    pub free_pages: u32,
    pub evictable_pages: u32,
    pub max_context: u32,
    #[serde(default = "yes")]
    pub online: bool,
    #[serde(default = "yes")]
    pub model_loaded: bool,
    /// Approximate KV is never executable; `false` is rejected outright.
    #[serde(default = "yes")]
    pub exact: bool,
    /// The resident route to fork: a GPU alternative's whole prefix, or a lower-tier
    /// alternative's resident head ([`Candidate::resident_token_count`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_continuation_id: Option<RouteId>,
    /// Lower tiers: how many leading tokens of the prefix are resident on the worker's GPU
    /// (in `source_continuation_id`) and forked as they are, the rest restored after them
    /// from `tier`; 0: the whole prefix comes from the tier. A GPU alternative's prefix is
    /// resident whole ([`Candidate::resident_tokens`]).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub resident_token_count: u32,
    #[serde(default)]
    pub transfer: TransferCapabilities,
    /// The delay choosing it adds to the requests already pending on its worker, ms
    /// ([`crate::engine_plan::price`]; 0 where the worker reports no engine plan). It
    /// ranks with the candidate's own TTFT: mean TTFT is the sum of everyone's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub imposed_ms: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl Candidate {
    /// Leading prefix tokens the worker already holds on its GPU and forks as they are.
    pub fn resident_tokens(&self) -> u32 {
        match self.tier {
            Tier::Gpu => self.cached_token_count,
            _ => self.resident_head(),
        }
    }

    /// A lower-tier alternative's resident head (0 for recompute and GPU alternatives).
    pub fn resident_head(&self) -> u32 {
        match self.tier {
            Tier::Gpu | Tier::None => 0,
            _ => self.resident_token_count.min(self.cached_token_count),
        }
    }
}

fn yes() -> bool {
    true
}

/// Why a candidate cannot serve a request. Checked in declaration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Infeasible {
    NotExact,
    WorkerOffline,
    ModelNotLoaded,
    ContextCapacityExceeded,
    PrefixLongerThanRequest,
    InsufficientPages,
}

impl Infeasible {
    pub fn as_str(self) -> &'static str {
        match self {
            Infeasible::NotExact => "not-exact",
            Infeasible::WorkerOffline => "worker-offline",
            Infeasible::ModelNotLoaded => "model-not-loaded",
            Infeasible::ContextCapacityExceeded => "context-capacity-exceeded",
            Infeasible::PrefixLongerThanRequest => "prefix-longer-than-request",
            Infeasible::InsufficientPages => "insufficient-pages",
        }
    }
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The estimate of one candidate for one request (spec §2.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// `None` when feasible.
    pub infeasible: Option<Infeasible>,
    pub processed: u32,
    pub cached: u32,
    /// `processed - cached`; negative when the prefix is longer than the request.
    pub missing: i64,
    pub target: u32,
    pub resident_pages: u32,
    pub required_pages: u32,
    pub available_pages: u32,
    pub live_overlap_eligible: bool,
    /// Predicted time to first token in milliseconds (0 when infeasible).
    pub ttft_ms: f64,
}

impl Estimate {
    pub fn feasible(&self) -> bool {
        self.infeasible.is_none()
    }
}

/// `ceil(n / page_size)`, 0 for 0 tokens. A zero page size counts every token as a page
/// so that a malformed observation can never make a request look free.
#[inline]
pub fn pages_for(tokens: u64, page_size: u32) -> u64 {
    if page_size == 0 {
        return tokens;
    }
    // Page sizes are powers of two in practice; a shift instead of a division is most
    // of the cost of scoring a candidate (a routing decision scores about a thousand).
    if page_size.is_power_of_two() {
        let shift = page_size.trailing_zeros();
        return (tokens >> shift) + u64::from(tokens & (u64::from(page_size) - 1) != 0);
    }
    tokens.div_ceil(page_size as u64)
}

/// Estimate candidate `c` for a request with `processed` tokens and `max_new` to generate.
///
/// ```text
/// ttft = max(queue, prefix_load) + gpu_restore + missing × prefill/token + first_token
/// ```
/// Queueing and lower-tier loading overlap; the GPU upload follows the load; the uncached
/// suffix is prefilled; one decode step yields the first token.
#[inline]
pub fn estimate_shape(processed: u32, max_new: u32, c: &Candidate) -> Estimate {
    let cached = c.cached_token_count;
    let missing = processed as i64 - cached as i64;
    let target = processed.saturating_add(max_new);
    let resident = pages_for(c.resident_tokens() as u64, c.page_size);
    let required = pages_for(target as u64, c.page_size).saturating_sub(resident);
    let available = c.free_pages as u64 + c.evictable_pages as u64;
    let infeasible = if !c.exact {
        Some(Infeasible::NotExact)
    } else if !c.online {
        Some(Infeasible::WorkerOffline)
    } else if !c.model_loaded {
        Some(Infeasible::ModelNotLoaded)
    } else if target > c.max_context {
        Some(Infeasible::ContextCapacityExceeded)
    } else if missing < 0 {
        Some(Infeasible::PrefixLongerThanRequest)
    } else if required > available {
        Some(Infeasible::InsufficientPages)
    } else {
        None
    };
    let ttft_ms = if infeasible.is_none() {
        c.queue_ms.max(c.prefix_load_ms)
            + c.gpu_restore_ms
            + missing as f64 * c.prefill_ms_per_token
            + c.first_token_ms
    } else {
        0.0
    };
    Estimate {
        infeasible,
        processed,
        cached,
        missing,
        target,
        resident_pages: clamp_u32(resident),
        required_pages: clamp_u32(required),
        available_pages: clamp_u32(available),
        live_overlap_eligible: c.transfer.live_overlap_eligible,
        ttft_ms,
    }
}

/// Estimate candidate `c` for `request`.
pub fn estimate(request: &GenerationRequest, c: &Candidate) -> Estimate {
    estimate_shape(request.processed(), request.max_new_tokens, c)
}

/// A candidate together with its estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    pub candidate: Candidate,
    pub estimate: Estimate,
}

impl Scored {
    /// What ranking minimises ([`fleet_cost_ms`]).
    pub fn cost_ms(&self) -> f64 {
        fleet_cost_ms(&self.candidate, &self.estimate)
    }
}

/// What ranking minimises: a candidate's own predicted TTFT plus the delay it imposes on
/// the worker's pending requests (mean TTFT is their sum).
#[inline]
pub fn fleet_cost_ms(c: &Candidate, e: &Estimate) -> f64 {
    e.ttft_ms + c.imposed_ms
}

/// The outcome of ranking: feasible candidates in offer order, and the infeasible ones
/// with their reasons (kept for the decision record).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Ranking {
    pub feasible: Vec<Scored>,
    pub infeasible: Vec<Scored>,
}

/// The work an assignment of `c` adds to its worker's execution queue, ms: the load and
/// GPU upload of the cached prefix, the prefill of the missing tokens and the first
/// decode step — the same declared costs the worker sums into its heartbeat's
/// `queue_ms`. A router adds it to the worker's last reported queue until a heartbeat
/// that includes the assignment arrives, so a burst does not pile onto the worker that
/// looked idle in its last heartbeat. 0 when infeasible.
pub fn added_work_ms(c: &Candidate, e: &Estimate) -> f64 {
    if !e.feasible() {
        return 0.0;
    }
    c.prefix_load_ms
        + c.gpu_restore_ms
        + e.missing.max(0) as f64 * c.prefill_ms_per_token
        + c.first_token_ms
}

/// Rank candidates: drop infeasible ones, then sort ascending by
/// `(ttft, −cached_token_count, worker id)`. The lowest predicted TTFT wins even when
/// another candidate has a longer prefix; ties prefer the longer exact prefix, then a
/// stable worker order.
pub fn rank(request: &GenerationRequest, candidates: Vec<Candidate>) -> Ranking {
    rank_shape(request.processed(), request.max_new_tokens, candidates)
}

/// [`rank`] for a request shape, without building a request.
pub fn rank_shape(processed: u32, max_new: u32, candidates: Vec<Candidate>) -> Ranking {
    let mut ranking = Ranking::default();
    for candidate in candidates {
        let estimate = estimate_shape(processed, max_new, &candidate);
        let scored = Scored {
            candidate,
            estimate,
        };
        if scored.estimate.feasible() {
            ranking.feasible.push(scored);
        } else {
            ranking.infeasible.push(scored);
        }
    }
    ranking.feasible.sort_by(offer_order);
    ranking
}

/// The total order in which feasible candidates are offered: by fleet cost, the
/// predicted TTFT plus the delay imposed on the worker's pending requests.
pub fn offer_order(a: &Scored, b: &Scored) -> Ordering {
    a.cost_ms()
        .total_cmp(&b.cost_ms())
        .then_with(|| {
            b.candidate
                .cached_token_count
                .cmp(&a.candidate.cached_token_count)
        })
        .then_with(|| a.candidate.worker_id.cmp(&b.candidate.worker_id))
        .then_with(|| a.candidate.tier.cmp(&b.candidate.tier))
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn pages_for_is_the_ceiling_for_every_page_size() {
        let tokens = [
            0u64,
            1,
            15,
            16,
            17,
            255,
            256,
            257,
            4095,
            u64::from(u32::MAX),
            u64::MAX,
        ];
        for page_size in (1..=300u32).chain([1 << 20, u32::MAX - 1, u32::MAX]) {
            for &t in &tokens {
                assert_eq!(
                    pages_for(t, page_size),
                    t.div_ceil(u64::from(page_size)),
                    "{t} / {page_size}"
                );
            }
        }
        assert_eq!(pages_for(7, 0), 7, "a zero page size counts every token");
    }

    /// The router-test fixture of spec §7.3: P = 100, max_new 16, page 16, free 32,
    /// max-context 2048, first-token 2.0.
    pub fn router_fixture(worker: &str, tier: Tier, cached: u32) -> Candidate {
        Candidate {
            worker_id: WorkerId::from(worker),
            worker_epoch: Epoch(0),
            tier,
            cached_token_count: cached,
            cached_bytes: 0,
            queue_ms: 0.0,
            prefix_load_ms: 0.0,
            gpu_restore_ms: 0.0,
            prefill_ms_per_token: 0.5,
            first_token_ms: 2.0,
            page_size: 16,
            free_pages: 32,
            evictable_pages: 0,
            max_context: 2048,
            online: true,
            model_loaded: true,
            exact: true,
            source_continuation_id: None,
            resident_token_count: 0,
            transfer: TransferCapabilities::default(),
            imposed_ms: 0.0,
        }
    }

    fn request_p100() -> GenerationRequest {
        GenerationRequest::new("r", "m", (0..101).collect(), 16).unwrap()
    }

    #[test]
    fn r1_lowest_ttft_wins_over_longest_prefix() {
        let remote = Candidate {
            prefix_load_ms: 80.0,
            gpu_restore_ms: 8.0,
            ..router_fixture("remote", Tier::Object, 100)
        };
        let local = Candidate {
            queue_ms: 5.0,
            ..router_fixture("local", Tier::Gpu, 64)
        };
        let r = request_p100();
        assert_eq!(estimate(&r, &remote).ttft_ms, 90.0);
        assert_eq!(estimate(&r, &local).ttft_ms, 25.0);
        let ranking = rank(&r, vec![remote, local]);
        let order: Vec<_> = ranking
            .feasible
            .iter()
            .map(|s| s.candidate.worker_id.as_str())
            .collect();
        assert_eq!(order, ["local", "remote"]);
    }

    #[test]
    fn r2_queue_and_load_overlap() {
        let c = Candidate {
            queue_ms: 30.0,
            prefix_load_ms: 20.0,
            gpu_restore_ms: 5.0,
            prefill_ms_per_token: 1.0,
            ..router_fixture("w", Tier::Ssd, 80)
        };
        let e = estimate(&request_p100(), &c);
        assert_eq!(e.ttft_ms, 57.0);
        assert_eq!(e.missing, 20);
        assert_eq!(e.required_pages, 8);
    }

    #[test]
    fn added_work_is_the_queued_cost_without_the_queue() {
        let c = Candidate {
            queue_ms: 30.0,
            prefix_load_ms: 20.0,
            gpu_restore_ms: 5.0,
            prefill_ms_per_token: 1.0,
            ..router_fixture("w", Tier::Ssd, 80)
        };
        let e = estimate(&request_p100(), &c);
        // load 20 + restore 5 + 20 missing × 1 + first token (the fixture's).
        assert_eq!(added_work_ms(&c, &e), 45.0 + c.first_token_ms);
        // The queue the worker already has is not work this assignment adds.
        let idle = Candidate {
            queue_ms: 0.0,
            ..c.clone()
        };
        assert_eq!(
            added_work_ms(&idle, &estimate(&request_p100(), &idle)),
            added_work_ms(&c, &e)
        );
        let full = Candidate {
            free_pages: 0,
            evictable_pages: 0,
            ..c
        };
        assert_eq!(added_work_ms(&full, &estimate(&request_p100(), &full)), 0.0);
    }

    #[test]
    fn r3_transfer_capability_is_exposed_but_never_discounts() {
        let plain = router_fixture("w", Tier::Ssd, 80);
        let overlapped = Candidate {
            transfer: TransferCapabilities {
                live_overlap_eligible: true,
            },
            ..plain.clone()
        };
        let r = request_p100();
        let (a, b) = (estimate(&r, &plain), estimate(&r, &overlapped));
        assert!(!a.live_overlap_eligible && b.live_overlap_eligible);
        assert_eq!(a.ttft_ms, b.ttft_ms);
    }

    #[test]
    fn r4_capacity_and_context_are_hard_constraints() {
        let r = request_p100();
        let tight = Candidate {
            free_pages: 1,
            ..router_fixture("w", Tier::None, 0)
        };
        assert_eq!(
            estimate(&r, &tight).infeasible,
            Some(Infeasible::InsufficientPages)
        );
        let short = Candidate {
            max_context: 110,
            ..router_fixture("w", Tier::None, 0)
        };
        assert_eq!(
            estimate(&r, &short).infeasible,
            Some(Infeasible::ContextCapacityExceeded)
        );
        let approx = Candidate {
            exact: false,
            ..router_fixture("w", Tier::None, 0)
        };
        assert_eq!(estimate(&r, &approx).infeasible, Some(Infeasible::NotExact));
        let long = router_fixture("w", Tier::Ssd, 101);
        assert_eq!(
            estimate(&r, &long).infeasible,
            Some(Infeasible::PrefixLongerThanRequest)
        );
    }

    #[test]
    fn ties_prefer_longer_prefix_then_worker_id() {
        let r = request_p100();
        // Both predict 2.0 + 0.5 × missing: make them equal with different prefixes.
        let a = Candidate {
            queue_ms: 10.0,
            ..router_fixture("b", Tier::Ssd, 100)
        };
        let b = Candidate {
            ..router_fixture("a", Tier::Ssd, 80)
        };
        let ranking = rank(&r, vec![b, a]);
        assert_eq!(
            ranking.feasible[0].estimate.ttft_ms,
            ranking.feasible[1].estimate.ttft_ms
        );
        assert_eq!(ranking.feasible[0].candidate.cached_token_count, 100);
        let c = router_fixture("z", Tier::None, 0);
        let d = router_fixture("y", Tier::None, 0);
        let ranking = rank(&r, vec![c, d]);
        assert_eq!(ranking.feasible[0].candidate.worker_id.as_str(), "y");
    }
}
