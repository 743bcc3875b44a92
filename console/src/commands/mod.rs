//! The console's commands (place, delete, cancel, drain): executing a confirmed command.
//! The TUI and the one-shot subcommands ([`oneshot`]) share this: every step is a
//! `CommandProgress` event and the end a `CommandOutcome`, so the Events panel and
//! recordings show what was done and how it ended. A placement is driven by [`place`].
//!
//! Outcomes are three-way. A command that certainly did not reach the server, or that
//! the server refused, failed; one that may have reached it without an answer (a
//! timeout after sending, a 5xx) is uncertain — look at the cluster before retrying.

pub mod cleanup;
mod delete;
pub mod oneshot;
pub mod place;
pub mod reconcile;

pub use delete::DELETE_CONFIRM;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use den_protocol::ids::NodeId;
use den_protocol::placement::{TransportFailure, WorkflowConfig};
use den_protocol::session::{CommandSeq, CommandStatus, SessionEvent, SourceId, SourceKind};
use den_protocol::skulk::error::ApiError;
use den_protocol::skulk::http::percent_encode;
use den_protocol::skulk::{HttpIntent, InstanceId, Method};

use self::place::{
    DEFAULT_PROBE_TIMEOUT, PlaceArgs, Progress, ProgressSink, default_fence_dir, exit_code_of,
    place_with,
};
use crate::app::Command;
use crate::app::intent::PlaceIntent;
use crate::config::SourceSpec;
use crate::http::{HttpAnswer, ManagementClient, UrlError};

/// Where commands go: the den router for cancel/drain, a management API for delete.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub router: Option<(SourceId, ManagementClient)>,
    /// Where placements keep their submission fences.
    pub fence_dir: PathBuf,
    /// Management APIs in configuration order (a den router last: it serves one too).
    pub management: Vec<(SourceId, ManagementClient)>,
}

impl Targets {
    pub fn new(
        specs: &[SourceSpec],
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<Targets, UrlError> {
        let mut targets = Targets {
            // No state or data directory (unusual): fences go under the working directory.
            fence_dir: default_fence_dir()
                .unwrap_or_else(|| PathBuf::from(".den-placement-fences")),
            ..Targets::default()
        };
        for spec in specs {
            let client = ManagementClient::new(&spec.url, token.map(str::to_owned), timeout)?;
            match spec.kind {
                SourceKind::DenRouter => targets.router = Some((spec.id.clone(), client)),
                SourceKind::Skulk => targets.management.push((spec.id.clone(), client)),
            }
        }
        if let Some(router) = &targets.router {
            targets.management.push(router.clone());
        }
        Ok(targets)
    }

    /// The management API to send a deletion to: `preferred` (the source whose state
    /// holds the instance) when configured, else the first.
    fn management_for(
        &self,
        preferred: Option<&SourceId>,
    ) -> Option<&(SourceId, ManagementClient)> {
        preferred
            .and_then(|p| self.management.iter().find(|(id, _)| id == p))
            .or_else(|| self.management.first())
    }
}

/// `place MODEL [NODE…]`: the placement runtime end to end (requirements → previews →
/// exact selection → fence → submit → reconcile → probe). The operator already confirmed
/// (palette confirmation or `den place` without `--yes` asking first).
async fn place(
    model: &str,
    nodes: &[String],
    intent: &PlaceIntent,
    target: Option<&(SourceId, ManagementClient)>,
    targets: &Targets,
    tx: &mpsc::Sender<SessionEvent>,
    id: CommandSeq,
) -> Finished {
    let Some((source, client)) = target else {
        return Finished {
            status: CommandStatus::Failed,
            detail: "place needs a management API (--skulk or --router)".to_owned(),
            outcome: None,
            exit_code: None,
        };
    };
    let _ = tx
        .send(SessionEvent::CommandProgress {
            id,
            note: format!("placing {model} through {source} ({})", client.origin()),
        })
        .await;
    let progress_tx = tx.clone();
    let watch = std::sync::Mutex::new(place::watch::Watch::default());
    let sink = ProgressSink::from_fn(move |note| {
        let text = match &note.event {
            // The evidence after each poll becomes one line of what it is waiting for,
            // said when that changes (and every few seconds while it moves).
            Progress::Evidence(report) => {
                let Ok(mut watch) = watch.lock() else { return };
                match watch.line(note.at_ms, report) {
                    Some(line) => line,
                    None => return,
                }
            }
            Progress::Waiting { .. } => return,
            // A successful /state poll is the evidence line's business, not a line of
            // its own; failures still show.
            Progress::Request { poll: true, .. } => return,
            Progress::Answer {
                poll: true,
                status: Some(200..300),
                ..
            } => return,
            event => event.to_string(),
        };
        let _ = progress_tx.try_send(SessionEvent::CommandProgress { id, note: text });
    });
    let mut args = PlaceArgs::new(model);
    args.nodes = nodes.iter().map(|n| NodeId::new(n.as_str())).collect();
    args.context_tokens = intent.context_tokens;
    args.management_node = intent.management_node.as_deref().map(NodeId::new);
    args.approved_card_digest = intent.card_digest.clone();
    args.compute = intent.compute.clone();
    args.hard_expiry_unix_ms = intent
        .expires
        .map(|e| e.unix_ms(place::clock::unix_now_ms()));
    let mut workflow = WorkflowConfig::default();
    if let Some(wait) = intent.wait {
        workflow.reconcile_deadline_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    }
    let result = place_with(
        client.clone(),
        &targets.fence_dir,
        &workflow,
        DEFAULT_PROBE_TIMEOUT,
        args,
        sink,
        None,
    )
    .await;
    let code = exit_code_of(&result);
    let status = match code {
        0 => CommandStatus::Ok,
        2 => CommandStatus::Uncertain,
        _ => CommandStatus::Failed,
    };
    let detail = match &result {
        Ok(outcome) => outcome.to_string(),
        Err(e) => format!("place {model}: {e}"),
    };
    Finished {
        status,
        detail,
        outcome: result.as_ref().ok().map(place::outcome_json),
        exit_code: u8::try_from(code).ok(),
    }
}

/// How a command ended, for the caller (and the exit code of a subcommand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub status: CommandStatus,
    pub detail: String,
    /// A placement's outcome as `den place --json` prints it ([`place::outcome_json`]).
    pub outcome: Option<serde_json::Value>,
    /// The one-shot command's exit status where it is finer than the status's
    /// (`den place`'s outcome classes); otherwise the status's.
    pub exit_code: Option<u8>,
}

/// Run `command`, reporting progress and the outcome on `tx` (also returned).
pub async fn execute(
    id: CommandSeq,
    command: Command,
    targets: &Targets,
    preferred: Option<SourceId>,
    tx: &mpsc::Sender<SessionEvent>,
) -> Finished {
    let progress = |note: String| SessionEvent::CommandProgress { id, note };
    let finished = match &command {
        Command::Cancel { request } => {
            match (&targets.router, targets.management_for(preferred.as_ref())) {
                (Some(router), _) => {
                    let path = format!("/v1/requests/{}/cancel", percent_encode(request));
                    send_to(Some(router), "", path, Method::Post, tx, &progress).await
                }
                // Skulk's own endpoint: REQUEST is a generation's command id (the stream's
                // `: command_id` line, or a TextGeneration task's commandId in /state).
                (None, Some(skulk)) => {
                    let path = format!("/v1/cancel/{}", percent_encode(request));
                    send_to(Some(skulk), "", path, Method::Post, tx, &progress).await
                }
                (None, None) => Finished {
                    status: CommandStatus::Failed,
                    detail: "cancel needs a den router (--router) or a Skulk API (--skulk)"
                        .to_owned(),
                    outcome: None,
                    exit_code: None,
                },
            }
        }
        Command::Drain { worker } => {
            let path = format!("/v1/workers/{}/drain", percent_encode(worker));
            send_to(
                targets.router.as_ref(),
                "drain needs a den router (--router)",
                path,
                Method::Post,
                tx,
                &progress,
            )
            .await
        }
        Command::Delete { instance } => {
            let id = InstanceId::new(instance.as_str());
            match targets.management_for(preferred.as_ref()) {
                Some(target) => {
                    let store = cleanup::CleanupStore::beside_fences(&targets.fence_dir);
                    delete::delete_with_intent(target, &id, &store, tx, &progress).await
                }
                None => Finished {
                    status: CommandStatus::Failed,
                    detail: "delete needs a management API (--skulk or --router)".to_owned(),
                    outcome: None,
                    exit_code: None,
                },
            }
        }
        Command::Place {
            model,
            nodes,
            intent,
        } => {
            place(
                model,
                nodes,
                intent,
                targets.management_for(preferred.as_ref()),
                targets,
                tx,
                id,
            )
            .await
        }
        other => Finished {
            status: CommandStatus::Failed,
            detail: format!("`{other}` is not a cluster command"),
            outcome: None,
            exit_code: None,
        },
    };
    let _ = tx
        .send(SessionEvent::CommandOutcome {
            id,
            status: finished.status,
            detail: finished.detail.clone(),
        })
        .await;
    finished
}

async fn send_to(
    target: Option<&(SourceId, ManagementClient)>,
    missing: &str,
    path: String,
    method: Method,
    tx: &mpsc::Sender<SessionEvent>,
    progress: &impl Fn(String) -> SessionEvent,
) -> Finished {
    let Some((source, client)) = target else {
        return Finished {
            status: CommandStatus::Failed,
            detail: missing.to_owned(),
            outcome: None,
            exit_code: None,
        };
    };
    let intent = HttpIntent {
        method,
        path,
        query: Vec::new(),
        body: None,
    };
    let _ = tx
        .send(progress(format!(
            "{method} {} → {source} ({})",
            intent.path,
            client.origin()
        )))
        .await;
    classify(&intent, client.execute(&intent).await)
}

/// The three-way outcome of one request.
pub fn classify(intent: &HttpIntent, result: Result<HttpAnswer, TransportFailure>) -> Finished {
    match result {
        Ok(answer) if (200..300).contains(&answer.status) => Finished {
            status: CommandStatus::Ok,
            detail: format!(
                "{} {}: done ({} ms)",
                intent.method,
                intent.path,
                answer.latency.as_millis()
            ),
            outcome: None,
            exit_code: None,
        },
        Ok(answer) => {
            let error = ApiError::from_response(answer.status, &answer.body);
            // A server error may come after the effect happened.
            let status = if answer.status >= 500 {
                CommandStatus::Uncertain
            } else {
                CommandStatus::Failed
            };
            let hint = if error.is_not_found() {
                " (not found: check the id)"
            } else {
                ""
            };
            Finished {
                status,
                detail: format!("{} {}: {error}{hint}", intent.method, intent.path),
                outcome: None,
                exit_code: None,
            }
        }
        Err(failure) if !failure.sent => Finished {
            status: CommandStatus::Failed,
            detail: format!("not sent: {}", failure.detail),
            outcome: None,
            exit_code: None,
        },
        Err(failure) => Finished {
            status: CommandStatus::Uncertain,
            detail: format!(
                "no answer, it may have been applied: {} — check the cluster before retrying",
                failure.detail
            ),
            outcome: None,
            exit_code: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Result<HttpAnswer, TransportFailure> {
        Ok(HttpAnswer {
            status,
            body: body.to_owned(),
            latency: Duration::from_millis(3),
        })
    }

    #[test]
    fn outcomes_are_three_way() {
        let intent = HttpIntent::delete("/instance/x");
        assert_eq!(
            classify(&intent, answer(200, "{}")).status,
            CommandStatus::Ok
        );
        let refused = classify(&intent, answer(404, r#"{"detail":"Instance not found"}"#));
        assert_eq!(refused.status, CommandStatus::Failed);
        assert!(refused.detail.contains("not found"), "{}", refused.detail);
        assert_eq!(
            classify(&intent, answer(503, "busy")).status,
            CommandStatus::Uncertain
        );
        let not_sent = Err(TransportFailure {
            sent: false,
            detail: "connection refused".into(),
        });
        assert_eq!(classify(&intent, not_sent).status, CommandStatus::Failed);
        let lost = Err(TransportFailure {
            sent: true,
            detail: "timed out".into(),
        });
        let lost = classify(&intent, lost);
        assert_eq!(lost.status, CommandStatus::Uncertain);
        assert!(!lost.detail.contains('\n'));
    }

    #[tokio::test]
    async fn commands_report_progress_and_outcome_events() {
        let (tx, mut rx) = mpsc::channel(16);
        let spec = SourceSpec {
            id: "router".into(),
            kind: SourceKind::DenRouter,
            url: "http://127.0.0.1:9".into(),
        };
        let mut targets = Targets::new(&[spec], None, Duration::from_secs(2)).unwrap();
        let fences = tempfile::tempdir().unwrap();
        targets.fence_dir = fences.path().join("fences");
        let done = execute(
            CommandSeq(1),
            Command::Cancel {
                request: "r 1".into(),
            },
            &targets,
            None,
            &tx,
        )
        .await;
        assert_eq!(done.status, CommandStatus::Failed, "{}", done.detail);
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        assert!(
            matches!(&events[0], SessionEvent::CommandProgress { note, .. } if note.contains("/v1/requests/r%201/cancel"))
        );
        assert!(matches!(
            &events[1],
            SessionEvent::CommandOutcome {
                status: CommandStatus::Failed,
                ..
            }
        ));
        let placed = execute(
            CommandSeq(2),
            Command::Place {
                model: "m".into(),
                nodes: vec![],
                intent: Default::default(),
            },
            &targets,
            None,
            &tx,
        )
        .await;
        // The management API is unreachable: the placement fails before anything is
        // written or sent.
        assert_eq!(placed.status, CommandStatus::Failed, "{}", placed.detail);
        assert!(placed.detail.contains("place m"), "{}", placed.detail);
        assert!(!targets.fence_dir.exists());
        let no_router = Targets::default();
        let drained = execute(
            CommandSeq(3),
            Command::Drain { worker: "w".into() },
            &no_router,
            None,
            &tx,
        )
        .await;
        assert_eq!(drained.detail, "drain needs a den router (--router)");
    }
}
