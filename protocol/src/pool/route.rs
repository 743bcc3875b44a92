//! Routes (spec §4.3): a continuation's KV as a list of physical pages.
//!
//! A route holds `ceil(token_count / page_size)` pages; token *i* lives in page
//! `pages[i / page_size]` at row `i % page_size`. Forks share a prefix's pages by
//! refcount and copy nothing; appends copy a shared partial tail first ([`super::append`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::append::{AppendId, PendingAppend};
use super::error::PoolError;
use super::evict::EvictKey;
use super::page::Page;
use crate::chunk::PrefixHash;
use crate::ids::{ModelFingerprint, RouteId};
use crate::time::Millis;

/// A resident continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub(super) pages: Vec<Page>,
    pub(super) token_count: u32,
    pub(super) start_position: u32,
    pub(super) policy: RoutePolicy,
    pub(super) pending: Option<PendingAppend>,
    /// The route's key in the eviction index, when it is durable and not pinned.
    pub(super) evict_key: Option<EvictKey>,
}

impl Route {
    /// Committed pages, in logical order.
    pub fn pages(&self) -> &[Page] {
        &self.pages
    }

    /// Committed tokens (rows with KV).
    pub fn token_count(&self) -> u32 {
        self.token_count
    }

    /// Absolute position of the route's first token (always 0 today: exact-prefix
    /// identity assumes position 0, spec §11 item 12).
    pub fn start_position(&self) -> u32 {
        self.start_position
    }

    pub fn policy(&self) -> &RoutePolicy {
        &self.policy
    }

    /// The pending append, if one is reserved and neither committed nor aborted.
    pub fn pending_append(&self) -> Option<AppendId> {
        self.pending.as_ref().map(|p| p.id)
    }
}

/// What the worker knows about a route's worth: durability, pinning, the inputs of its
/// eviction value (spec §4.6), recency, and the prefix identity it advertises.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RoutePolicy {
    /// Reproducible from published durable chunks: eviction loses no data. Set only after
    /// a checkpoint's catalog publication succeeded.
    #[serde(default)]
    pub durable: bool,
    /// Never evicted.
    #[serde(default)]
    pub pinned: bool,
    /// Probability in [0, 1] that the route is reused.
    #[serde(default)]
    pub reuse_probability: f64,
    /// Cost of recomputing the route's KV, in milliseconds.
    #[serde(default)]
    pub recompute_ms: f64,
    /// Cost of reloading it from its durable chunks, in milliseconds.
    #[serde(default)]
    pub reload_ms: f64,
    #[serde(default)]
    pub sharing_bonus: f64,
    #[serde(default)]
    pub slo_bonus: f64,
    /// Last time the route was used; older routes are evicted first at equal density.
    #[serde(default)]
    pub last_access: Millis,
    /// The exact prefix identity recorded after decode; absent means "not advertised".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<RouteIdentity>,
}

/// The recorded prefix hashes of a route: token boundary → chained prefix hash, under
/// one model fingerprint. Appends never change earlier rows, so a recorded boundary
/// stays valid while the route grows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteIdentity {
    pub model: ModelFingerprint,
    pub prefixes: BTreeMap<u32, PrefixHash>,
}

impl RoutePolicy {
    /// Eviction value in milliseconds of utility:
    /// `reuse_probability × max(0, recompute_ms − reload_ms) + sharing_bonus + slo_bonus`.
    pub fn value(&self) -> f64 {
        self.reuse_probability * (self.recompute_ms - self.reload_ms).max(0.0)
            + self.sharing_bonus
            + self.slo_bonus
    }

    /// Every number finite and ≥ 0, the probability at most 1.
    pub fn validate(&self) -> Result<(), PoolError> {
        let fields = [
            ("reuse_probability", self.reuse_probability),
            ("recompute_ms", self.recompute_ms),
            ("reload_ms", self.reload_ms),
            ("sharing_bonus", self.sharing_bonus),
            ("slo_bonus", self.slo_bonus),
        ];
        for (name, v) in fields {
            if !v.is_finite() || v < 0.0 {
                return Err(PoolError::InvalidPolicy(name));
            }
        }
        if self.reuse_probability > 1.0 {
            return Err(PoolError::InvalidPolicy("reuse_probability"));
        }
        Ok(())
    }
}

impl PagePool {
    /// Create route `id` holding `tokens` tokens in `ceil(tokens / page_size)` fresh
    /// pages, taken from the route's capacity reservation first, then the free set
    /// (lowest numbers first). Returns the pages. The route starts non-durable.
    pub fn allocate(&mut self, id: &RouteId, tokens: u32) -> Result<Vec<Page>, PoolError> {
        if self.routes.contains_key(id) {
            return Err(PoolError::RouteExists(id.clone()));
        }
        let n = self.geometry.pages_for(tokens);
        let pages: Vec<Page> = self
            .take_pages(id, n)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        self.routes.insert(
            id.clone(),
            Route {
                pages: pages.clone(),
                token_count: tokens,
                start_position: 0,
                policy: RoutePolicy::default(),
                pending: None,
                evict_key: None,
            },
        );
        Ok(pages)
    }

    /// Create `target` sharing the pages of the first `tokens` tokens of `source`
    /// (all of it when `None`); each shared page's refcount grows by one, nothing is
    /// copied. The source must have no pending append and none of the shared pages may
    /// be loading (their contents are not there yet).
    pub fn fork(
        &mut self,
        source: &RouteId,
        target: &RouteId,
        tokens: Option<u32>,
    ) -> Result<(), PoolError> {
        if self.routes.contains_key(target) {
            return Err(PoolError::RouteExists(target.clone()));
        }
        let src = self
            .routes
            .get(source)
            .ok_or_else(|| PoolError::UnknownRoute(source.clone()))?;
        if src.pending.is_some() {
            return Err(PoolError::AppendPending(source.clone()));
        }
        let n = tokens.unwrap_or(src.token_count);
        if n > src.token_count {
            return Err(PoolError::ForkTooLong {
                from: source.clone(),
                tokens: n,
                has: src.token_count,
            });
        }
        let k = self.geometry.pages_for(n) as usize;
        let shared: Vec<Page> = src.pages.iter().take(k).copied().collect();
        let start_position = src.start_position;
        if let Some(p) = shared
            .iter()
            .find(|p| self.slot(**p).state == super::page::SlotState::Loading)
        {
            return Err(PoolError::PageNotIdle {
                page: *p,
                state: "loading",
            });
        }
        for p in &shared {
            self.retain(*p);
        }
        self.routes.insert(
            target.clone(),
            Route {
                pages: shared,
                token_count: n,
                start_position,
                policy: RoutePolicy::default(),
                pending: None,
                evict_key: None,
            },
        );
        Ok(())
    }

    /// Drop route `id`: one reference per page; a page whose count reaches 0 returns to
    /// the free set. Refused while an append is pending. `Ok(false)` when the route does
    /// not exist (release is idempotent). The route's capacity reservation, if any, is
    /// left alone: it belongs to the admission and is released with it.
    pub fn release_route(&mut self, id: &RouteId) -> Result<bool, PoolError> {
        let Some(route) = self.routes.get(id) else {
            return Ok(false);
        };
        if route.pending.is_some() {
            return Err(PoolError::AppendPending(id.clone()));
        }
        let Some(route) = self.routes.remove(id) else {
            return Ok(false);
        };
        if let Some(key) = &route.evict_key {
            self.evict_index.remove(key);
        }
        for page in route.pages {
            self.drop_ref(page, None);
        }
        Ok(true)
    }

    /// Replace a route's policy (validated first).
    pub fn set_policy(&mut self, id: &RouteId, policy: RoutePolicy) -> Result<(), PoolError> {
        self.update_policy(id, |p| *p = policy)
    }

    /// Change a route's policy in place; the change is validated and undone when invalid.
    pub fn update_policy(
        &mut self,
        id: &RouteId,
        f: impl FnOnce(&mut RoutePolicy),
    ) -> Result<(), PoolError> {
        let route = self
            .routes
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRoute(id.clone()))?;
        let mut policy = route.policy.clone();
        f(&mut policy);
        policy.validate()?;
        route.policy = policy;
        self.reindex(id);
        Ok(())
    }

    /// Record that the route was used at `now`.
    pub fn touch(&mut self, id: &RouteId, now: Millis) -> Result<(), PoolError> {
        self.update_policy(id, |p| p.last_access = p.last_access.max(now))
    }

    /// Record exact prefix hashes of the route at token boundaries (its end and chunk
    /// boundaries), under `model`, so the worker advertises them. Each boundary must be in
    /// `1..=token_count`; a route records one model only.
    pub fn record_prefixes(
        &mut self,
        id: &RouteId,
        model: &ModelFingerprint,
        prefixes: impl IntoIterator<Item = (u32, PrefixHash)>,
    ) -> Result<(), PoolError> {
        let route = self
            .routes
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRoute(id.clone()))?;
        let prefixes: Vec<(u32, PrefixHash)> = prefixes.into_iter().collect();
        if let Some((boundary, _)) = prefixes
            .iter()
            .find(|(b, _)| *b == 0 || *b > route.token_count)
        {
            return Err(PoolError::BoundaryOutsideRoute {
                route: id.clone(),
                boundary: *boundary,
                tokens: route.token_count,
            });
        }
        let identity = route.policy.identity.get_or_insert_with(|| RouteIdentity {
            model: model.clone(),
            prefixes: BTreeMap::new(),
        });
        if &identity.model != model {
            return Err(PoolError::ModelMismatch {
                route: id.clone(),
                recorded: identity.model.clone(),
            });
        }
        identity.prefixes.extend(prefixes);
        Ok(())
    }

    /// Put `id` in the eviction index under its current key, or take it out when it is
    /// not durable or pinned.
    pub(super) fn reindex(&mut self, id: &RouteId) {
        let Some(route) = self.routes.get_mut(id) else {
            return;
        };
        if let Some(old) = route.evict_key.take() {
            self.evict_index.remove(&old);
        }
        if route.policy.durable && !route.policy.pinned {
            let key = EvictKey::new(id.clone(), &route.policy, route.pages.len());
            self.evict_index.insert(key.clone());
            route.evict_key = Some(key);
        }
    }
}
