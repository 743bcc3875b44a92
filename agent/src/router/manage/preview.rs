//! `GET /instance/previews`: one preview per candidate node, admitted or refused with a
//! stable `error_code`.
//!
//! Candidates are single live workers (an instance runs on one node). `node_ids` is
//! subset matching as in Skulk: a candidate is kept when it contains every node asked
//! for, so more than one distinct node leaves no candidate. `excluded_node_ids` drops
//! candidates. A preview reserves nothing; its ids are fresh each time.
//!
//! Codes: `model_unknown`, `no_valid_placement` (no candidate is left), `node_unavailable`
//! (draining), `backend_incompatible`, `runner_busy`, `insufficient_memory` (the node's
//! KV budget does not hold one page of the card).

use std::collections::{BTreeMap, BTreeSet};

use den_protocol::ids::{NodeId, WorkerId};
use den_protocol::skulk::api::{InstanceMeta, PlacementPreview, PreviewsResponse, Sharding};
use den_protocol::skulk::model::ShardFields;
use den_protocol::skulk::{InstanceId, ModelId, RunnerId, ShardAssignments, ShardMetadata};
use den_protocol::time::Millis;

use super::catalog::Card;
use super::{Manager, WorkerView, den_instance};

/// The query of `GET /instance/previews`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewQuery {
    pub model_id: ModelId,
    pub node_ids: BTreeSet<NodeId>,
    pub excluded_node_ids: BTreeSet<NodeId>,
}

impl Manager {
    pub fn previews(&mut self, now: Millis, q: &PreviewQuery) -> PreviewsResponse {
        let Some(card) = self.catalog().get(&q.model_id).cloned() else {
            let error = format!(
                "model {} is not in the catalog (it has: {})",
                q.model_id,
                self.catalog().ids()
            );
            return response(vec![refused(&q.model_id, None, error, "model_unknown")]);
        };
        let candidates: Vec<WorkerId> = self
            .workers
            .keys()
            .filter(|w| self.live(now, w).is_some())
            .filter(|w| !q.excluded_node_ids.contains(&node_of(w)))
            .filter(|w| q.node_ids.iter().all(|n| *n == node_of(w)))
            .cloned()
            .collect();
        if candidates.is_empty() {
            let why = if q.node_ids.len() > 1 {
                format!(
                    "den places an instance on one node, and no single node contains all of {}",
                    join(&q.node_ids)
                )
            } else if let Some(n) = q.node_ids.iter().next() {
                if q.excluded_node_ids.contains(n) {
                    format!("node {n} is both wanted and excluded")
                } else {
                    format!("node {n} is not a live worker of this router")
                }
            } else {
                "no live worker is left after the exclusions".to_owned()
            };
            return response(vec![refused(
                &q.model_id,
                Some(&card),
                why,
                "no_valid_placement",
            )]);
        }
        let mut previews = Vec::with_capacity(candidates.len());
        for worker in candidates {
            let Some(view) = self.live(now, &worker).cloned() else {
                continue;
            };
            previews.push(self.preview_on(&card, &worker, &view));
        }
        response(previews)
    }

    fn preview_on(
        &mut self,
        card: &Card,
        worker: &WorkerId,
        view: &WorkerView,
    ) -> PlacementPreview {
        let node = node_of(worker);
        if view.draining {
            return refused(
                &card.model_id,
                Some(card),
                format!("node {node} is draining"),
                "node_unavailable",
            );
        }
        let backend = view.backend_kind();
        if !card.backends.iter().any(|b| b == backend) {
            return refused(
                &card.model_id,
                Some(card),
                format!(
                    "node {node} runs the {backend} backend; the card is compatible with {}",
                    card.backends.join(", ")
                ),
                "backend_incompatible",
            );
        }
        if let Some(busy) = self.busy(worker) {
            return refused(&card.model_id, Some(card), busy, "runner_busy");
        }
        let Some(limit) = context_limit(card, view.kv_budget_bytes, view.page_size) else {
            return refused(
                &card.model_id,
                Some(card),
                memory_message(card, view),
                "insufficient_memory",
            );
        };
        let instance_id = InstanceId::new(self.next_id());
        let runner = RunnerId::new(self.next_id());
        let assignments = assignments(card, &node, &runner, backend);
        let storage = i64::try_from(card.storage_bytes()).unwrap_or(i64::MAX);
        PlacementPreview {
            model_id: card.model_id.clone(),
            sharding: Sharding::Pipeline,
            instance_meta: InstanceMeta::Other("Den".to_owned()),
            instance: Some(den_instance(&instance_id, &assignments, Some(limit))),
            memory_delta_by_node: Some(BTreeMap::from([(node, storage)])),
            error: None,
            error_code: None,
            card_digest: Some(card.digest.clone()),
            context_token_limit: Some(limit),
            max_context_tokens: Some(limit),
            compatibility_detail: None,
            extra: Default::default(),
        }
    }
}

/// One runner on `node` serving every layer of the card.
pub(crate) fn assignments(
    card: &Card,
    node: &NodeId,
    runner: &RunnerId,
    backend: &str,
) -> ShardAssignments {
    let layers = u64::from(card.kv.layers);
    let shard = ShardMetadata::Pipeline(ShardFields {
        model_card: card.model_card(),
        device_rank: 0,
        world_size: 1,
        resolved_backend: Some(backend.to_owned()),
        immediate_exception: false,
        should_timeout: None,
        start_layer: 0,
        end_layer: layers,
        n_layers: layers,
        cfg_rank: None,
        cfg_world_size: None,
        pipeline_rank: None,
        pipeline_world_size: None,
        extra: Default::default(),
    });
    ShardAssignments {
        model_id: card.model_id.clone(),
        runner_to_shard: BTreeMap::from([(runner.clone(), shard)]),
        node_to_runner: BTreeMap::from([(node.clone(), runner.clone())]),
        extra: Default::default(),
    }
}

/// Tokens a runner's page pool holds for one sequence on a node with `budget` bytes of
/// KV budget and pages of `page_size` tokens, capped by the card's context length;
/// `None` when not even one page fits.
pub(crate) fn context_limit(card: &Card, budget: u64, page_size: u32) -> Option<u64> {
    let page_bytes = card
        .kv
        .bytes_per_token()
        .checked_mul(u64::from(page_size))?;
    let pages = budget.checked_div(page_bytes)?;
    if pages == 0 {
        return None;
    }
    Some(
        pages
            .saturating_mul(u64::from(page_size))
            .min(card.context_length),
    )
}

pub(crate) fn memory_message(card: &Card, view: &WorkerView) -> String {
    format!(
        "the node's KV budget of {} bytes does not hold one page of {} tokens × {} bytes per token; raise the worker's --kv-budget",
        view.kv_budget_bytes,
        view.page_size,
        card.kv.bytes_per_token()
    )
}

pub(crate) fn node_of(worker: &WorkerId) -> NodeId {
    NodeId::new(worker.as_str())
}

fn refused(model: &ModelId, card: Option<&Card>, error: String, code: &str) -> PlacementPreview {
    PlacementPreview {
        model_id: model.clone(),
        sharding: Sharding::Pipeline,
        instance_meta: InstanceMeta::Other("Den".to_owned()),
        instance: None,
        memory_delta_by_node: None,
        error: Some(error),
        error_code: Some(code.to_owned()),
        card_digest: card.map(|c| c.digest.clone()),
        context_token_limit: None,
        max_context_tokens: None,
        compatibility_detail: None,
        extra: Default::default(),
    }
}

fn response(previews: Vec<PlacementPreview>) -> PreviewsResponse {
    PreviewsResponse {
        previews,
        extra: Default::default(),
    }
}

fn join(nodes: &BTreeSet<NodeId>) -> String {
    nodes
        .iter()
        .map(NodeId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}
