//! The seam between the OpenAI-compatible ingress and the router runtime.
//!
//! The ingress owns HTTP, chat templating and tokenisation; it submits protocol requests
//! and consumes a bounded stream of deliveries. The router runtime owns the router state
//! machine. Neither knows the other's internals, so the ingress can be tested against an
//! in-process stand-in and the router against a test client.

use std::sync::Arc;

use tokio::sync::mpsc;

use den_protocol::ids::{ModelFingerprint, RequestId};
use den_protocol::request::GenerationRequest;
use den_protocol::router::Delivery;

/// Deliveries buffered per request before the client is considered too slow (spec §9:
/// per-session bounded queue of 256 events; overflow cancels the request).
pub const DELIVERY_QUEUE: usize = 256;

/// Deliveries for one submitted request, ending with exactly one terminal delivery.
pub type DeliveryStream = mpsc::Receiver<Delivery>;

/// Why a submission was refused before it reached the router state machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("request id {0} is already in use")]
    DuplicateId(RequestId),
    #[error("the router is shutting down and takes no new requests")]
    ShuttingDown,
    #[error("the router is overloaded: {0}")]
    Overloaded(String),
    #[error(
        "no model instance {0} is placed on this router: name one from GET /state, or leave den_instance out"
    )]
    UnknownInstance(String),
    #[error(
        "instance {instance} serves model {serves}, not {asked}: ask it for its own model, or leave den_instance out"
    )]
    InstanceModel {
        instance: String,
        serves: String,
        asked: String,
    },
}

/// A model the cluster can serve, as listed by `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// The public id clients send as `model`.
    pub id: String,
    pub fingerprint: ModelFingerprint,
    /// Workers currently advertising the model.
    pub workers: usize,
    /// The largest context any of those workers admits.
    pub max_context: u32,
}

/// What the ingress needs from the router runtime.
pub trait Submitter: Send + Sync + 'static {
    /// Submit a request; deliveries arrive on the returned stream. Dropping the stream
    /// without a terminal delivery does not cancel: call [`Submitter::cancel`].
    fn submit(&self, request: GenerationRequest) -> Result<DeliveryStream, SubmitError>;

    /// Submit a request to be served only by the placed model instance `instance` (den's
    /// management API: the placement probe pins itself with `?den_instance=ID`). A
    /// runtime without placed instances serves it like [`Submitter::submit`].
    fn submit_pinned(
        &self,
        request: GenerationRequest,
        instance: Option<&str>,
    ) -> Result<DeliveryStream, SubmitError> {
        let _ = instance;
        self.submit(request)
    }

    /// Cancel a request (client disconnect, slow client, explicit cancel). Idempotent.
    fn cancel(&self, request: &RequestId);

    /// Models that live workers advertise right now.
    fn models(&self) -> Vec<ServedModel>;

    /// The model instance that served a completed request, when the runtime knows (den's
    /// router does for placed models; answered as `served_by`).
    fn served_by(&self, request: &RequestId) -> Option<String> {
        let _ = request;
        None
    }
}

/// A shared submitter.
pub type SharedSubmitter = Arc<dyn Submitter>;
