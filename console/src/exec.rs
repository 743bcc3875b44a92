//! Executing confirmed commands. The TUI and the non-interactive subcommands share this:
//! every step is a `CommandProgress` event and the end a `CommandOutcome`, so the Events
//! panel and recordings show what was done and how it ended.
//!
//! Outcomes are three-way. A command that certainly did not reach the server, or that
//! the server refused, failed; one that may have reached it without an answer (a
//! timeout after sending, a 5xx) is uncertain — look at the cluster before retrying.

use std::time::Duration;

use tokio::sync::mpsc;

use den_protocol::placement::TransportFailure;
use den_protocol::session::{CommandSeq, CommandStatus, SessionEvent, SourceId, SourceKind};
use den_protocol::skulk::error::ApiError;
use den_protocol::skulk::http::percent_encode;
use den_protocol::skulk::{HttpIntent, InstanceId, Method};

use crate::app::Command;
use crate::config::SourceSpec;
use crate::http::{HttpAnswer, ManagementClient, UrlError};

/// Where commands go: the den router for cancel/drain, a management API for delete.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub router: Option<(SourceId, ManagementClient)>,
    /// Management APIs in configuration order (a den router last: it serves one too).
    pub management: Vec<(SourceId, ManagementClient)>,
}

impl Targets {
    pub fn new(
        specs: &[SourceSpec],
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<Targets, UrlError> {
        let mut targets = Targets::default();
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

/// How a command ended, for the caller (and the exit code of a subcommand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub status: CommandStatus,
    pub detail: String,
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
            let path = format!("/v1/requests/{}/cancel", percent_encode(request));
            send_to(
                targets.router.as_ref(),
                "cancel needs a den router (--router)",
                path,
                Method::Post,
                tx,
                &progress,
            )
            .await
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
            let intent = HttpIntent::delete_instance(&InstanceId::new(instance.as_str()));
            send_to(
                targets.management_for(preferred.as_ref()),
                "delete needs a management API (--skulk or --router)",
                intent.path,
                Method::Delete,
                tx,
                &progress,
            )
            .await
        }
        // INTEGRATION(place): the placement runtime (`crate::place`, being written) runs
        // the protocol's PlacementWorkflow here: requirements → previews → choose →
        // confirm → fence → submit → reconcile, reporting each step as CommandProgress
        // and ending Placed/Failed/Uncertain. Until it lands, placing is refused.
        Command::Place { .. } => Finished {
            status: CommandStatus::Failed,
            detail: "place: not yet available in this build".to_owned(),
        },
        other => Finished {
            status: CommandStatus::Failed,
            detail: format!("`{other}` is not a cluster command"),
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
            }
        }
        Err(failure) if !failure.sent => Finished {
            status: CommandStatus::Failed,
            detail: format!("not sent: {}", failure.detail),
        },
        Err(failure) => Finished {
            status: CommandStatus::Uncertain,
            detail: format!(
                "no answer, it may have been applied: {} — check the cluster before retrying",
                failure.detail
            ),
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
        let targets = Targets::new(&[spec], None, Duration::from_secs(2)).unwrap();
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
            },
            &targets,
            None,
            &tx,
        )
        .await;
        assert_eq!(placed.detail, "place: not yet available in this build");
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
