//! `delete`: the cleanup intent is recorded before the `DELETE` is sent; the deletion is
//! done, and the intent cleared, only when absence is confirmed — `/state` stops listing
//! the instance, or the server says it has no such instance. Otherwise the intent stays
//! and `den reconcile` retries it ([`retry`]).

use std::time::Duration;

use tokio::sync::mpsc;

use den_protocol::session::{CommandStatus, SessionEvent, SourceId};
use den_protocol::skulk::{HttpIntent, InstanceId};

use super::cleanup::{CleanupIntent, CleanupStore};
use super::{Finished, classify};
use crate::http::ManagementClient;

/// How long `delete` watches `/state` for the instance to go after the acknowledgement.
pub const DELETE_CONFIRM: Duration = Duration::from_secs(10);
const DELETE_POLL: Duration = Duration::from_millis(250);

/// A management API acknowledges a `DELETE` before the instance is gone (Skulk queues a
/// command): the deletion is done only once `/state` no longer lists it. Within
/// `within`: ok; after: uncertain, "deletion requested, not yet confirmed".
async fn confirm_deleted(
    client: &ManagementClient,
    id: &InstanceId,
    acknowledged: Finished,
    within: Duration,
    every: Duration,
) -> Finished {
    let t0 = std::time::Instant::now();
    let last_problem = loop {
        let problem = match client
            .get_json::<den_protocol::skulk::state::State>("/state")
            .await
        {
            Ok((state, _)) if !state.instances.contains_key(id) => {
                return Finished {
                    status: CommandStatus::Ok,
                    detail: format!(
                        "{}; {id} is gone from /state after {} ms",
                        acknowledged.detail,
                        t0.elapsed().as_millis()
                    ),
                    outcome: None,
                    exit_code: None,
                };
            }
            Ok(_) => format!("{id} is still listed in /state"),
            Err(e) => format!("/state could not be read: {e}"),
        };
        if t0.elapsed() >= within {
            break problem;
        }
        tokio::time::sleep(every).await;
    };
    Finished {
        status: CommandStatus::Uncertain,
        detail: format!(
            "deletion requested, not yet confirmed: {last_problem} {} s after the acknowledgement; check with `den status`",
            within.as_secs()
        ),
        outcome: None,
        exit_code: None,
    }
}

/// Whether a deletion attempt established that the instance is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Absence {
    /// `/state` stopped listing it after the acknowledgement.
    Confirmed,
    /// The server has no such instance (404): gone, or never there.
    NoSuchInstance,
    /// Not established: the intent is kept.
    NotConfirmed,
}

/// One deletion through `target`, with its cleanup intent. A 404 fails the command (an
/// operator who typed an id expected one) though absence is confirmed.
pub async fn delete_with_intent(
    target: &(SourceId, ManagementClient),
    id: &InstanceId,
    store: &CleanupStore,
    tx: &mpsc::Sender<SessionEvent>,
    progress: &impl Fn(String) -> SessionEvent,
) -> Finished {
    let origin = target.1.origin();
    let intent = store
        .list()
        .into_iter()
        .filter_map(Result::ok)
        .find(|i| i.instance_id == *id && i.origin == origin)
        .unwrap_or_else(|| {
            CleanupIntent::new(origin, id.clone(), super::place::clock::unix_now_ms())
        });
    let (mut finished, absence) = attempt(target, intent, store, tx, progress).await;
    if absence == Absence::NoSuchInstance {
        finished.status = CommandStatus::Failed;
    }
    finished
}

/// Records the intent (one more attempt), sends `DELETE`, and clears the intent when
/// absence is established.
async fn attempt(
    target: &(SourceId, ManagementClient),
    mut intent: CleanupIntent,
    store: &CleanupStore,
    tx: &mpsc::Sender<SessionEvent>,
    progress: &impl Fn(String) -> SessionEvent,
) -> (Finished, Absence) {
    let (source, client) = target;
    let id = intent.instance_id.clone();
    intent.attempts = intent.attempts.saturating_add(1);
    match store.save(&intent) {
        Ok(path) => {
            let _ = tx
                .send(progress(format!(
                    "cleanup intent recorded: {}",
                    path.display()
                )))
                .await;
        }
        Err(e) => {
            let failed = Finished {
                status: CommandStatus::Failed,
                detail: format!("the cleanup intent could not be recorded, nothing was sent: {e}"),
                outcome: None,
                exit_code: None,
            };
            return (failed, Absence::NotConfirmed);
        }
    }
    let request = HttpIntent::delete_instance(&id);
    let _ = tx
        .send(progress(format!(
            "{} {} → {source} ({})",
            request.method,
            request.path,
            client.origin()
        )))
        .await;
    let answer = client.execute(&request).await;
    if let Ok(a) = &answer
        && a.status == 404
    {
        let detail = format!(
            "{} {}: the server has no instance {id}: nothing to delete (check the id)",
            request.method, request.path
        );
        return (absent(store, &id, detail), Absence::NoSuchInstance);
    }
    let sent = classify(&request, answer);
    if sent.status != CommandStatus::Ok {
        return (kept(sent), Absence::NotConfirmed);
    }
    let _ = tx
        .send(progress(format!(
            "deletion acknowledged; waiting for {id} to leave /state"
        )))
        .await;
    let confirmed = confirm_deleted(client, &id, sent, DELETE_CONFIRM, DELETE_POLL).await;
    if confirmed.status == CommandStatus::Ok {
        (absent(store, &id, confirmed.detail), Absence::Confirmed)
    } else {
        (kept(confirmed), Absence::NotConfirmed)
    }
}

fn absent(store: &CleanupStore, id: &InstanceId, detail: String) -> Finished {
    match store.clear(id) {
        Ok(()) => Finished {
            status: CommandStatus::Ok,
            detail,
            outcome: None,
            exit_code: None,
        },
        Err(e) => Finished {
            status: CommandStatus::Ok,
            detail: format!("{detail}; {e}"),
            outcome: None,
            exit_code: None,
        },
    }
}

fn kept(mut finished: Finished) -> Finished {
    finished.detail = format!(
        "{}; the cleanup intent is kept: `den reconcile` retries the deletion until absence is confirmed",
        finished.detail
    );
    finished
}

/// `den reconcile`'s part: every stored intent for `target`'s origin, retried.
pub async fn retry(
    target: &(SourceId, ManagementClient),
    store: &CleanupStore,
    tx: &mpsc::Sender<SessionEvent>,
) -> Vec<(InstanceId, Finished)> {
    let progress = |note: String| SessionEvent::Note { text: note };
    let mut out = Vec::new();
    for intent in store.list().into_iter().filter_map(Result::ok) {
        if intent.origin != target.1.origin() {
            continue;
        }
        let instance = intent.instance_id.clone();
        // For a retry, "no such instance" is the absence it was waiting for.
        let (finished, _) = attempt(target, intent, store, tx, &progress).await;
        out.push((instance, finished));
    }
    out
}
