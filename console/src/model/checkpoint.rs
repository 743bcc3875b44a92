//! Model checkpoints: the model's state as JSON, for the snapshot lines of recordings.
//!
//! A checkpoint holds what the events built (sources, the evidence reducer, workers,
//! decision records, commands, the Events log, the time of the latest event) and
//! nothing derived: the panel rows, the evidence report and node names are rebuilt on
//! restore by the same code that builds them live. Rows depend only on that state (the
//! report is computed as of the latest evidence input, not of the last settle), so a
//! restored model draws the same frames as the model it was taken from, and applying
//! the following events to it gives the same model as applying them to the original.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use den_protocol::decision::DecisionRecord;
use den_protocol::evidence::EvidenceReducer;
use den_protocol::ids::{RequestId, WorkerId};
use den_protocol::session::{CommandSeq, SourceId};
use den_protocol::skulk::InstanceId;
use den_protocol::time::Millis;

use super::feed::route_row;
use super::{
    CommandTrack, EventLine, Indexed, Model, ModelConfig, SourceTrack, Versions, Views, WorkerTrack,
};

/// A model checkpoint, as read back from a recording.
#[derive(Debug, Clone, Deserialize)]
pub struct Checkpoint {
    config: ModelConfig,
    now: Millis,
    evidence_at: Option<Millis>,
    sources: BTreeMap<SourceId, SourceTrack>,
    evidence: EvidenceReducer,
    workers: Vec<(SourceId, WorkerId, WorkerTrack)>,
    /// Route rows in their storage order, as `(source, updated_at, record)`.
    routes: Vec<(SourceId, Millis, DecisionRecord)>,
    commands: BTreeMap<CommandSeq, CommandTrack>,
    log: Vec<EventLine>,
    log_seq: u64,
    /// The newest inference record seen of each instance (older recordings lack it).
    #[serde(default)]
    inference_seen: Vec<InferenceSeen>,
    #[serde(default)]
    catalogs: BTreeMap<SourceId, Vec<String>>,
}

/// `((source, instance), (completed, last completed at))`: a list, since JSON object
/// keys cannot be pairs.
type InferenceSeen = ((SourceId, InstanceId), (u64, Option<String>));
type InferenceSeenRef<'a> = (&'a (SourceId, InstanceId), &'a (u64, Option<String>));

/// The same fields, borrowed from a live model for writing.
#[derive(Serialize)]
struct CheckpointRef<'a> {
    config: &'a ModelConfig,
    now: Millis,
    evidence_at: Option<Millis>,
    sources: &'a BTreeMap<SourceId, SourceTrack>,
    evidence: &'a EvidenceReducer,
    workers: Vec<(&'a SourceId, &'a WorkerId, &'a WorkerTrack)>,
    routes: Vec<(&'a SourceId, Millis, &'a DecisionRecord)>,
    commands: &'a BTreeMap<CommandSeq, CommandTrack>,
    log: &'a [EventLine],
    log_seq: u64,
    inference_seen: Vec<InferenceSeenRef<'a>>,
    catalogs: &'a BTreeMap<SourceId, Vec<String>>,
}

/// A checkpoint that could not be written or read.
#[derive(Debug, thiserror::Error)]
#[error("model checkpoint: {0}")]
pub struct CheckpointError(String);

impl Model {
    /// The model's state as one line of JSON.
    pub fn checkpoint_json(&self) -> Result<String, CheckpointError> {
        let view = CheckpointRef {
            config: &self.config,
            now: self.now,
            evidence_at: self.evidence_at,
            sources: &self.sources,
            evidence: &self.evidence,
            workers: self.workers.iter().map(|((s, w), t)| (s, w, t)).collect(),
            routes: self
                .routes
                .rows
                .iter()
                .map(|r| (&r.source, r.updated_at, r.record.as_ref()))
                .collect(),
            commands: &self.commands,
            log: &self.log,
            log_seq: self.log_seq,
            inference_seen: self.inference_seen.iter().collect(),
            catalogs: &self.catalogs,
        };
        serde_json::to_string(&view).map_err(|e| CheckpointError(e.to_string()))
    }

    /// Rebuild a model from a checkpoint, settled.
    pub fn from_checkpoint(c: Checkpoint) -> Model {
        let mut routes: Indexed<(SourceId, RequestId), super::RouteRow> = Indexed::default();
        for (source, at, record) in &c.routes {
            let row = route_row(*at, source, record);
            routes.upsert((source.clone(), record.request.clone()), row);
        }
        let workers = c.workers.into_iter().map(|(s, w, t)| ((s, w), t)).collect();
        let mut model = Model {
            config: c.config,
            now: c.now,
            sources: c.sources,
            evidence: c.evidence,
            evidence_at: c.evidence_at,
            report: None,
            workers,
            routes,
            commands: c.commands,
            log: c.log,
            log_seq: c.log_seq,
            node_names: BTreeMap::new(),
            views: Views::default(),
            versions: Versions::default(),
            // Everything derived is rebuilt; the report only if the live model had one.
            cluster_dirty: c.evidence_at.is_some(),
            workers_dirty: true,
            sources_dirty: true,
            inference_seen: c.inference_seen.into_iter().collect(),
            catalogs: c.catalogs,
        };
        model.settle();
        model
    }

    /// Parse a checkpoint written by [`Model::checkpoint_json`].
    pub fn from_checkpoint_json(json: &str) -> Result<Model, CheckpointError> {
        let c: Checkpoint =
            serde_json::from_str(json).map_err(|e| CheckpointError(e.to_string()))?;
        Ok(Model::from_checkpoint(c))
    }
}

#[cfg(test)]
mod tests {
    use den_protocol::session::Stamped;
    use den_protocol::time::Millis;

    use crate::app::{App, Panel};
    use crate::fixtures;
    use crate::model::Model;
    use crate::testing;
    use crate::theme::Theme;

    /// Every panel of `model` drawn at `now`, as text with styles.
    fn frames(model: &Model, now: Millis) -> Vec<String> {
        let theme = Theme::default();
        Panel::ALL
            .iter()
            .map(|p| {
                let mut app = App::focused(*p);
                testing::styled(&testing::draw(&mut app, model, &theme, now, 120, 40))
            })
            .collect()
    }

    fn scenarios() -> Vec<Vec<Stamped>> {
        vec![
            fixtures::scenario().unwrap(),
            fixtures::run_c_scenario().unwrap(),
        ]
    }

    #[test]
    fn rows_do_not_depend_on_when_the_model_settled() {
        for events in scenarios() {
            let mut often = Model::default();
            let mut once = Model::default();
            for (i, e) in events.iter().enumerate() {
                often.apply(e);
                once.apply(e);
                if i % 3 == 0 {
                    often.settle();
                }
            }
            once.settle();
            often.settle();
            let now = once.now().saturating_add(700);
            assert_eq!(frames(&often, now), frames(&once, now));
        }
    }

    #[test]
    fn a_restored_checkpoint_draws_and_continues_like_the_original() {
        for events in scenarios() {
            let step = (events.len() / 7).max(1);
            for cut in (0..events.len()).step_by(step) {
                let mut live = Model::default();
                for e in &events[..cut] {
                    live.apply(e);
                    live.settle();
                }
                let json = live.checkpoint_json().unwrap();
                let mut restored = Model::from_checkpoint_json(&json).unwrap();
                let now = live.now().saturating_add(250);
                assert_eq!(frames(&restored, now), frames(&live, now), "cut {cut}");
                assert_eq!(restored.checkpoint_json().unwrap(), json, "cut {cut}");
                for e in &events[cut..] {
                    live.apply(e);
                    restored.apply(e);
                }
                live.settle();
                restored.settle();
                let end = live.now().saturating_add(1_000);
                assert_eq!(frames(&restored, end), frames(&live, end), "cut {cut}");
                assert_eq!(
                    restored.checkpoint_json().unwrap(),
                    live.checkpoint_json().unwrap()
                );
            }
        }
    }
}
