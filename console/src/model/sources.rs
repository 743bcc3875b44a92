//! Source events: registration, connection changes, `/node_id` and `/state` answers and
//! poll failures (the evidence reducer sees every poll).

use den_protocol::evidence::{
    EndpointLabel, Input, PollFailure, PollObservation, PollResult, ProbeOutcome,
};
use den_protocol::ids::NodeId;
use den_protocol::session::{SourceId, SourceKind};
use den_protocol::skulk::State;
use den_protocol::time::Millis;

use super::{Health, Level, Model, SourceRow, SourceTrack};

impl Model {
    pub(super) fn source_mut(&mut self, source: &SourceId) -> &mut SourceTrack {
        self.sources_dirty = true;
        self.versions.sources += 1;
        self.sources
            .entry(source.clone())
            .or_insert_with(|| SourceTrack {
                kind: SourceKind::Skulk,
                url: String::new(),
                feed: None,
                api: Health::Connecting,
                latency_ms: None,
                last_ok: None,
                node: None,
                pending_node: None,
                router: None,
                state_at: None,
                state_clock: None,
            })
    }

    pub(super) fn add_source(
        &mut self,
        at: Millis,
        source: &SourceId,
        kind: SourceKind,
        url: &str,
    ) {
        let track = self.source_mut(source);
        track.kind = kind;
        track.url = url.to_owned();
        track.feed = (kind == SourceKind::DenRouter).then_some(Health::Connecting);
        self.evidence_at = Some(at);
        self.cluster_dirty = true;
        // Registering an endpoint decides nothing yet: no notice to show.
        let _notices = self.evidence.handle(
            at,
            Input::Endpoint {
                endpoint: EndpointLabel::new(source.as_str()),
                expected_node: None,
            },
        );
        self.log_line(
            at,
            Some(source),
            Level::Info,
            format!("source added: {kind} {url}"),
        );
    }

    pub(super) fn connected(&mut self, at: Millis, source: &SourceId) {
        let track = self.source_mut(source);
        if track.kind == SourceKind::DenRouter {
            track.feed = Some(Health::Connected);
        } else {
            track.api = Health::Connected;
        }
        let what = if track.kind == SourceKind::DenRouter {
            "feed connected"
        } else {
            "connected"
        };
        self.log_line(at, Some(source), Level::Good, what.to_owned());
    }

    pub(super) fn disconnected(&mut self, at: Millis, source: &SourceId, reason: &str) {
        let track = self.source_mut(source);
        let health = |old: Option<&Health>| Health::Disconnected {
            since: match old {
                Some(Health::Disconnected { since, .. }) => *since,
                _ => at,
            },
            reason: reason.to_owned(),
        };
        let what = if track.kind == SourceKind::DenRouter {
            track.feed = Some(health(track.feed.as_ref()));
            "feed disconnected"
        } else {
            track.api = health(Some(&track.api));
            "disconnected"
        };
        // Feed rows of this source are now stale; the panels draw them so.
        self.workers_dirty = true;
        self.versions.routes += 1;
        self.log_line(at, Some(source), Level::Bad, format!("{what}: {reason}"));
    }

    pub(super) fn node_id(&mut self, at: Millis, source: &SourceId, node: &NodeId) {
        let track = self.source_mut(source);
        // A later change is a restart or a conflict: the evidence reducer decides which
        // and says so when the state of the same cycle arrives.
        let first = track.node.is_none();
        track.node = Some(node.clone());
        track.pending_node = Some(node.clone());
        if first {
            self.log_line(
                at,
                Some(source),
                Level::Info,
                format!("answers as node {node}"),
            );
        }
    }

    pub(super) fn state(
        &mut self,
        at: Millis,
        source: &SourceId,
        state: &State,
        latency_ms: u64,
        received_unix_ms: Option<u64>,
    ) {
        let track = self.source_mut(source);
        let first = track.state_at.is_none();
        let recovered = matches!(track.api, Health::Disconnected { .. });
        track.api = Health::Connected;
        track.latency_ms = Some(latency_ms);
        track.last_ok = Some(at);
        track.state_at = Some(at);
        track.state_clock = received_unix_ms;
        let node_id = track.pending_node.take();
        self.evidence_at = Some(at);
        let notices = self.evidence.handle(
            at,
            Input::Poll(PollObservation {
                endpoint: EndpointLabel::new(source.as_str()),
                node_id,
                result: PollResult::State(Box::new(state.clone())),
            }),
        );
        self.served_inference(at, source, state);
        if first || recovered {
            let text = format!(
                "/state answers ({} nodes, {} instances, {latency_ms} ms)",
                state.topology.nodes.len(),
                state.instances.len()
            );
            self.log_line(at, Some(source), Level::Good, text);
        }
        self.log_notices(at, source, notices);
        self.cluster_dirty = true;
    }

    /// den's routers report, per instance, the ordinary inference its current runner
    /// served (`/state.inference`). A new completion there is a successful probe through
    /// that management API, attributed to the instance by the router that routed it:
    /// this console sends no inference of its own, so this is how `den status` sees what
    /// `den place` (or any client) proved. Only a record for the instance's current
    /// runner counts, and only when it changed since this source last reported it.
    fn served_inference(&mut self, at: Millis, source: &SourceId, state: &State) {
        let Some(records) = &state.inference else {
            return;
        };
        for (instance, record) in records {
            if record.completed == 0 {
                continue;
            }
            let current = state
                .instances
                .get(instance)
                .and_then(|i| i.core())
                .is_some_and(|core| match &record.runner_id {
                    Some(runner) => core
                        .shard_assignments
                        .node_to_runner
                        .values()
                        .any(|r| r == runner),
                    None => true,
                });
            if !current {
                continue;
            }
            let seen = (record.completed, record.last_completed_at.clone());
            let key = (source.clone(), instance.clone());
            if self.inference_seen.get(&key) == Some(&seen) {
                continue;
            }
            self.inference_seen.insert(key, seen);
            // A served request is quiet evidence: the Instances panel shows its effect.
            let _notices = self.evidence.handle(
                at,
                Input::Probe {
                    instance: instance.clone(),
                    outcome: ProbeOutcome::Succeeded {
                        served_by: Some(instance.clone()),
                    },
                },
            );
            let text = format!(
                "instance {} served inference ({} completed, router record)",
                super::log::short(instance.as_str()),
                record.completed
            );
            self.log_line(at, Some(source), Level::Good, text);
        }
    }

    pub(super) fn poll_failed(
        &mut self,
        at: Millis,
        source: &SourceId,
        endpoint: &str,
        failure: &PollFailure,
        latency_ms: u64,
    ) {
        let track = self.source_mut(source);
        let first_failure = !matches!(track.api, Health::Disconnected { .. });
        track.latency_ms = Some(latency_ms);
        // Down since the last good answer, not since den gave up on the poll that failed
        // (a frozen node fails each poll only at its timeout).
        track.api = Health::Disconnected {
            since: match &track.api {
                Health::Disconnected { since, .. } => *since,
                _ => track.last_ok.unwrap_or(at).min(at),
            },
            reason: failure.to_string(),
        };
        let node_id = track.pending_node.take();
        self.evidence_at = Some(at);
        let notices = self.evidence.handle(
            at,
            Input::Poll(PollObservation {
                endpoint: EndpointLabel::new(source.as_str()),
                node_id,
                result: PollResult::Failed(failure.clone()),
            }),
        );
        if first_failure {
            self.log_line(
                at,
                Some(source),
                Level::Bad,
                format!("GET {endpoint} failed: {failure}"),
            );
        }
        self.log_notices(at, source, notices);
        self.cluster_dirty = true;
        self.workers_dirty = true;
    }

    pub(super) fn rebuild_sources(&mut self) {
        self.views.sources = self
            .sources
            .iter()
            .map(|(id, s)| SourceRow {
                source: id.clone(),
                kind: s.kind,
                url: s.url.clone(),
                feed: s.feed.clone(),
                api: s.api.clone(),
                latency_ms: s.latency_ms,
                last_ok: s.last_ok,
                node: s.node.clone(),
                router: s.router.clone(),
            })
            .collect();
    }
}
