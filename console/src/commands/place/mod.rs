//! The placement runtime: drives den-protocol's pure [`PlacementWorkflow`] against a
//! management API over real HTTP, with durable submission fences and real timers.
//!
//! ```text
//! requirements → preview for the exact node set → select → baseline /state
//!   → fence written (temp + fsync + rename + dir fsync) → POST /instance
//!   → reconcile /state until the deadline → one inference probe → outcome
//! ```
//!
//! - [`PlaceDriver`] runs one placement ([`PlaceDriver::place`]) or resumes one stored
//!   fence ([`PlaceDriver::resume`]) and returns the [`Outcome`]: placed, failed(reason)
//!   or uncertain (the fence is kept; nothing is ever re-posted).
//! - [`FenceStore`] is the directory of fence files; [`resume_all`] resumes every fence
//!   in it after a restart, straight into reconciliation.
//! - [`ProgressSink`] receives typed [`ProgressNote`]s (steps, requests, notes, evidence).
//! - [`place`], [`PlaceOptions`], [`PlaceArgs`], [`exit_code`] and [`outcome_json`] are
//!   what `den place MODEL [--node ID]... [--yes] [--json]` calls.
//!
//! Time base: the workflow runs on logical milliseconds since the driver was created
//! ([`Clock`]); fences on disk hold wall-clock UNIX milliseconds. On resume the
//! reconcile deadline is recomputed from the moment of resumption; the hard expiry stays
//! absolute (see `clock`).
//!
//! Credentials: every request, the probe included, goes through one
//! [`ManagementClient`], which sends its bearer token to its own origin only and never
//! follows redirects.

pub(crate) mod clock;
mod driver;
mod fence_store;
mod progress;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinSet;

use den_protocol::ids::NodeId;
use den_protocol::placement::{FailureClass, Outcome, PlacementRequest, WorkflowConfig};
use den_protocol::skulk::{InstanceId, ModelId};

use crate::http::{DEFAULT_TIMEOUT, ManagementClient};

pub use clock::{Clock, unix_now_ms};
pub use den_protocol::placement::PlacementWorkflow;
pub use driver::{ConfirmFn, DEFAULT_PROBE_TIMEOUT, PlaceDriver, PlaceError, SubmissionPlan};
pub use fence_store::{
    FENCE_FILE_VERSION, FENCE_KIND, FenceEntry, FenceError, FenceStore, StoredFence,
};
pub use progress::{Progress, ProgressNote, ProgressSink};

/// Exit status of `den place` for a placed instance.
pub const EXIT_PLACED: i32 = 0;
/// … for a placement that was submitted and then failed: nothing left to reconcile.
pub const EXIT_FAILED: i32 = 1;
/// … for an uncertain one: the fence is kept and must be reconciled.
pub const EXIT_UNCERTAIN: i32 = 2;
/// … refused before submission: the intent cannot be met as given (no exact preview,
/// a node the topology lacks, another management node, a changed card, a 4xx answer).
/// Nothing was placed; change the intent.
pub const EXIT_REFUSED: i32 = 3;
/// … not attempted: the management API could not be read, the fence not written, or
/// the request never left. Nothing was placed; retry when it is reachable.
pub const EXIT_NOT_ATTEMPTED: i32 = 4;
/// … declined at the confirmation prompt: nothing was written or sent.
pub const EXIT_DECLINED: i32 = 5;

/// Where and how to place.
#[derive(Debug, Clone)]
pub struct PlaceOptions {
    /// The management API base URL, e.g. `http://127.0.0.1:52415`.
    pub management: String,
    /// Bearer token for that origin only.
    pub token: Option<String>,
    /// Deadline of each management request.
    pub request_timeout: Duration,
    /// Deadline of the one inference probe.
    pub probe_timeout: Duration,
    /// Directory of submission fences.
    pub fence_dir: PathBuf,
    pub workflow: WorkflowConfig,
}

impl PlaceOptions {
    pub fn new(management: impl Into<String>, fence_dir: impl Into<PathBuf>) -> PlaceOptions {
        PlaceOptions {
            management: management.into(),
            token: None,
            request_timeout: DEFAULT_TIMEOUT,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            fence_dir: fence_dir.into(),
            workflow: WorkflowConfig::default(),
        }
    }

    pub fn client(&self) -> Result<ManagementClient, PlaceError> {
        Ok(ManagementClient::new(
            &self.management,
            self.token.clone(),
            self.request_timeout,
        )?)
    }
}

/// What `den place` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceArgs {
    pub model: ModelId,
    /// The exact node set; empty means the management API's own node.
    pub nodes: Vec<NodeId>,
    pub context_tokens: Option<u64>,
    /// The node the management API must answer as; `None` binds to its first answer.
    pub management_node: Option<NodeId>,
    pub approved_card_digest: Option<String>,
    /// The external resource's expiry (UNIX ms): an upper bound for every deadline.
    pub hard_expiry_unix_ms: Option<u64>,
    /// The compute node's own API (`--compute URL`), polled beside the management API.
    pub compute: Option<String>,
}

impl PlaceArgs {
    pub fn new(model: impl Into<ModelId>) -> PlaceArgs {
        PlaceArgs {
            model: model.into(),
            nodes: Vec::new(),
            context_tokens: None,
            management_node: None,
            approved_card_digest: None,
            hard_expiry_unix_ms: None,
            compute: None,
        }
    }
}

/// Runs `den place`: one placement to its outcome. `confirm` is asked before the fence
/// is written (pass `None` for `--yes`).
pub async fn place(
    options: &PlaceOptions,
    args: PlaceArgs,
    progress: ProgressSink,
    confirm: Option<Arc<ConfirmFn>>,
) -> Result<Outcome, PlaceError> {
    let client = options.client()?;
    place_with(
        client,
        &options.fence_dir,
        &options.workflow,
        options.probe_timeout,
        args,
        progress,
        confirm,
    )
    .await
}

/// [`place`] through an existing client (the console's configured management source).
pub async fn place_with(
    client: ManagementClient,
    fence_dir: &Path,
    workflow: &WorkflowConfig,
    probe_timeout: Duration,
    args: PlaceArgs,
    progress: ProgressSink,
    confirm: Option<Arc<ConfirmFn>>,
) -> Result<Outcome, PlaceError> {
    let nodes: BTreeSet<NodeId> = if args.nodes.is_empty() {
        default_nodes(&client, &args.model).await?
    } else {
        args.nodes.into_iter().collect()
    };
    let store = FenceStore::open(fence_dir)?;
    // An earlier placement of this intent that ended uncertain (or was interrupted)
    // left its fence: reconcile that submission instead of posting a second instance —
    // the blind repeat the integration guide forbids.
    let earlier = same_intent(&store.list()?, &client.origin(), &args.model, &nodes);
    // The token belongs to the management origin: a compute endpoint elsewhere gets none
    // (Skulk's /node_id and /state need none).
    let compute_url = earlier
        .as_ref()
        .and_then(|e| e.compute.clone())
        .or_else(|| args.compute.clone());
    let compute = match compute_url {
        Some(url) => Some(compute_client(&client, &url)?),
        None => None,
    };
    let computing = compute.is_some();
    let mut driver = PlaceDriver::new(client, store, workflow.clone())
        .with_probe_timeout(probe_timeout)
        .with_progress(progress)
        .with_compute(compute);
    if let Some(stored) = earlier {
        return driver.resume(stored).await;
    }
    if let Some(confirm) = confirm {
        driver = driver.with_confirmation(confirm);
    }
    let hard_expiry = args
        .hard_expiry_unix_ms
        .map(|t| driver.clock().from_unix_ms(t));
    let request = PlacementRequest {
        model_id: args.model,
        nodes,
        context_tokens: args.context_tokens,
        management_node: args.management_node,
        approved_card_digest: args.approved_card_digest,
        hard_expiry,
        compute: computing,
    };
    driver.place(request).await
}

/// A client for the compute node's API: the management token only when it is the
/// management origin itself.
pub fn compute_client(
    management: &ManagementClient,
    url: &str,
) -> Result<ManagementClient, PlaceError> {
    let probe = ManagementClient::new(url, None, management.timeout())?;
    let token = (probe.origin() == management.origin())
        .then(|| management.token().map(str::to_owned))
        .flatten();
    Ok(ManagementClient::new(url, token, management.timeout())?)
}

/// The stored fence of an earlier submission of the same intent (origin, model, node
/// set), the newest when there are several.
pub fn same_intent(
    entries: &[FenceEntry],
    origin: &str,
    model: &ModelId,
    nodes: &BTreeSet<NodeId>,
) -> Option<StoredFence> {
    entries
        .iter()
        .filter_map(|e| e.fence.as_ref().ok())
        .filter(|s| s.origin == origin && &s.fence.model_id == model && &s.fence.nodes == nodes)
        .max_by_key(|s| s.fence.created_at)
        .cloned()
}

/// The node set `den place MODEL` targets without `--node`: the nodes of the first
/// admitted preview for the model (a den router is a node that runs no model, so its
/// own id is no target), else the management API's own node (a single Skulk node).
/// The workflow then previews that exact set again and checks it, as for `--node`.
async fn default_nodes(
    client: &ManagementClient,
    model: &ModelId,
) -> Result<BTreeSet<NodeId>, PlaceError> {
    let intent = den_protocol::skulk::HttpIntent::previews(model, [], []);
    if let Ok(answer) = client.execute(&intent).await
        && (200..300).contains(&answer.status)
        && let Ok(previews) =
            serde_json::from_str::<den_protocol::skulk::api::PreviewsResponse>(&answer.body)
        && let Some(first) = previews.previews.iter().find(|p| p.is_admitted())
    {
        let nodes = first.nodes();
        if !nodes.is_empty() {
            return Ok(nodes);
        }
    }
    Ok(BTreeSet::from([own_node(client).await?]))
}

/// The management API's own node id (the fallback target of `den place`).
async fn own_node(client: &ManagementClient) -> Result<NodeId, PlaceError> {
    client
        .get_json::<NodeId>("/node_id")
        .await
        .map(|(node, _)| node)
        .map_err(|e| {
            PlaceError::Setup(format!(
                "no --node given and the management node id could not be read: {e}"
            ))
        })
}

/// What became of one fence file in [`resume_all`].
#[derive(Debug)]
pub struct Resumed {
    pub path: PathBuf,
    pub instance_id: Option<InstanceId>,
    pub result: ResumeResult,
}

#[derive(Debug)]
pub enum ResumeResult {
    Finished(Outcome),
    /// The file could not be read or parsed; it was left alone.
    Unreadable(FenceError),
    /// It was submitted to another management origin; it was left alone.
    OtherOrigin {
        origin: String,
    },
    Error(PlaceError),
}

/// Resumes every fence in `fence_dir` that was submitted to `client`'s origin, all at
/// once, each straight into reconciliation (never re-posting). Results are in file order.
pub async fn resume_all(
    fence_dir: &Path,
    client: &ManagementClient,
    config: &WorkflowConfig,
    probe_timeout: Duration,
    progress: ProgressSink,
) -> Result<Vec<Resumed>, FenceError> {
    let store = FenceStore::open(fence_dir)?;
    let origin = client.origin();
    let mut results: Vec<Option<Resumed>> = Vec::new();
    let mut tasks = JoinSet::new();
    let mut running = BTreeMap::new();
    for (index, entry) in store.list()?.into_iter().enumerate() {
        let path = entry.path;
        let stored = match entry.fence {
            Ok(stored) => stored,
            Err(e) => {
                results.push(Some(Resumed {
                    path,
                    instance_id: None,
                    result: ResumeResult::Unreadable(e),
                }));
                continue;
            }
        };
        let instance_id = Some(stored.instance_id().clone());
        if stored.origin != origin {
            results.push(Some(Resumed {
                path,
                instance_id,
                result: ResumeResult::OtherOrigin {
                    origin: stored.origin,
                },
            }));
            continue;
        }
        results.push(None);
        let driver = PlaceDriver::new(client.clone(), store.clone(), config.clone())
            .with_probe_timeout(probe_timeout)
            .with_progress(progress.clone());
        let slot = (index, path.clone(), instance_id.clone());
        let handle = tasks.spawn(async move {
            let result = match driver.resume(stored).await {
                Ok(outcome) => ResumeResult::Finished(outcome),
                Err(e) => ResumeResult::Error(e),
            };
            (
                index,
                Resumed {
                    path,
                    instance_id,
                    result,
                },
            )
        });
        running.insert(handle.id(), slot);
    }
    while let Some(joined) = tasks.join_next().await {
        let (index, resumed) = match joined {
            Ok(done) => done,
            // A driver that panicked (a bug): report it against its fence, which stays.
            Err(e) => {
                let Some((index, path, instance_id)) = running.remove(&e.id()) else {
                    continue;
                };
                let error = PlaceError::Setup(format!("the resumed placement stopped: {e}"));
                let resumed = Resumed {
                    path,
                    instance_id,
                    result: ResumeResult::Error(error),
                };
                (index, resumed)
            }
        };
        if let Some(slot) = results.get_mut(index) {
            *slot = Some(resumed);
        }
    }
    Ok(results.into_iter().flatten().collect())
}

/// [`resume_all`] with [`PlaceOptions`].
pub async fn resume_fences(
    options: &PlaceOptions,
    progress: ProgressSink,
) -> Result<Vec<Resumed>, PlaceError> {
    let client = options.client()?;
    Ok(resume_all(
        &options.fence_dir,
        &client,
        &options.workflow,
        options.probe_timeout,
        progress,
    )
    .await?)
}

/// `den place`'s exit status, one per outcome class (README "Exit codes").
pub fn exit_code(outcome: &Outcome) -> i32 {
    match outcome {
        Outcome::Placed { .. } => EXIT_PLACED,
        Outcome::Failed { reason, .. } => match reason.class() {
            FailureClass::Refused => EXIT_REFUSED,
            FailureClass::NotAttempted => EXIT_NOT_ATTEMPTED,
            FailureClass::FailedAfterSubmission => EXIT_FAILED,
        },
        Outcome::Uncertain { .. } => EXIT_UNCERTAIN,
    }
}

/// The exit status of a whole `den place` run: a run that stopped after submitting is
/// uncertain; one that stopped before, or could not start, was not attempted.
pub fn exit_code_of(result: &Result<Outcome, PlaceError>) -> i32 {
    match result {
        Ok(outcome) => exit_code(outcome),
        Err(PlaceError::Stalled {
            instance_id: Some(_),
            ..
        }) => EXIT_UNCERTAIN,
        Err(PlaceError::Declined { .. }) => EXIT_DECLINED,
        Err(_) => EXIT_NOT_ATTEMPTED,
    }
}

/// The `--json` rendering of an outcome:
/// `{"outcome": "placed"|"failed"|"uncertain", "instance_id", "command_id", "reason",
/// "detail", "class", "exit_code"}` where `reason` is one line, `detail` the typed reason
/// and `class` a failure's class (`refused`, `not-attempted`, `failed-after-submission`).
pub fn outcome_json(outcome: &Outcome) -> Value {
    let (kind, instance_id, command_id, reason, detail) = match outcome {
        Outcome::Placed {
            instance_id,
            command_id,
        } => (
            "placed",
            Some(instance_id),
            command_id.as_ref().map(|c| c.as_str()),
            None,
            Value::Null,
        ),
        Outcome::Failed {
            instance_id,
            reason,
        } => (
            "failed",
            instance_id.as_ref(),
            None,
            Some(reason.to_string()),
            serde_json::to_value(reason).unwrap_or(Value::Null),
        ),
        Outcome::Uncertain {
            instance_id,
            reason,
        } => (
            "uncertain",
            instance_id.as_ref(),
            None,
            Some(reason.to_string()),
            serde_json::to_value(reason).unwrap_or(Value::Null),
        ),
    };
    json!({
        "outcome": kind,
        "instance_id": instance_id.map(InstanceId::as_str),
        "command_id": command_id,
        "reason": reason,
        "detail": detail,
        "class": match outcome {
            Outcome::Failed { reason, .. } => serde_json::to_value(reason.class()).unwrap_or(Value::Null),
            _ => Value::Null,
        },
        "exit_code": exit_code(outcome),
    })
}

/// The readiness deadline of every stored fence, as events relative to now (wall clock
/// `now_unix_ms`), for a console or `den status` starting up: the deadline den placed an
/// instance with is the one every den process shows. Unreadable fences are skipped here
/// (`den reconcile` names them).
pub fn fence_deadlines(
    fence_dir: &Path,
    now_unix_ms: u64,
) -> Vec<den_protocol::session::SessionEvent> {
    // Reading must not create the directory (FenceStore::open would).
    if !fence_dir.is_dir() {
        return Vec::new();
    }
    let Ok(store) = FenceStore::open(fence_dir) else {
        return Vec::new();
    };
    let Ok(list) = store.list() else {
        return Vec::new();
    };
    list.into_iter()
        .filter_map(|entry| entry.fence.ok())
        .map(
            |stored| den_protocol::session::SessionEvent::PlacementDeadline {
                instance: stored.fence.instance_id.clone(),
                deadline_in_ms: stored
                    .fence
                    .reconcile_deadline
                    .0
                    .saturating_sub(now_unix_ms),
                hard_expiry_in_ms: stored
                    .fence
                    .hard_expiry
                    .map(|h| h.0.saturating_sub(now_unix_ms)),
            },
        )
        .collect()
}

/// The default fence directory: `$XDG_STATE_HOME/den/placement-fences` (or the
/// platform's local data directory).
pub fn default_fence_dir() -> Option<PathBuf> {
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .map(|d| d.join("den").join("placement-fences"))
}

#[cfg(test)]
mod tests;
