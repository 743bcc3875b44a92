//! The Skulk management API, in both dialects den speaks.
//!
//! 1. Skulk 1.3.0 as it is (`skulk-api-1.3.0.md`, fixtures in `tests/fixtures/skulk-1.3.0`).
//! 2. The newer contract of the integration guide, which den's own router serves:
//!    `attemptId` on download records, `registryCardId` on cards, `instanceFailures` and
//!    `nodeResources` in `/state`, `GET /models/requirements`, preview
//!    `error_code`/`card_digest`/`contextTokenLimit`, `instance_id` in the placement
//!    response, and den's `commands` status map.
//!
//! Rules that hold for every type here:
//! - Tagged unions are single-key objects (`{"RunnerReady": {}}`); there is no `type`
//!   field. An unknown tag parses as `Unknown { tag, value }`.
//! - Casing follows each object's regime: camelCase state objects, snake_case envelopes,
//!   snake_case inside `/events` (accepted through aliases on the state types).
//! - Unknown fields are kept in `extra` and written back; absent newer fields are
//!   `None` (incomplete evidence), never a parse error and never "ready".
//! - Serialising a body den received gives the same JSON back; newer fields are written
//!   only when present, so den's router serves the newer dialect with the same types.

pub mod api;
pub mod chat;
pub mod common;
pub mod download;
pub mod error;
pub mod events;
pub mod extra;
pub mod http;
pub mod instance;
pub mod model;
pub mod node;
pub mod runner;
pub mod sse;
pub mod state;
pub(crate) mod tagged;
pub mod task;
pub mod topology;

pub use api::{
    CreateInstanceRequest, CreateInstanceResponse, DeleteInstanceResponse, DownloadCommandResponse,
    InstanceMeta, MemoryEstimate, ModelList, ModelListEntry, ModelRequirements,
    NodeIdentityResponse, PlaceInstanceParams, PlacementPreview, PreviewsResponse, Sharding,
    StartDownloadRequest,
};
pub use common::{
    AttemptId, CommandId, EventId, InstanceId, Memory, ModelId, RegistryCardId, RunnerId, TaskId,
};
pub use download::{DownloadPhase, DownloadProgress};
pub use error::{ApiError, ResponseError, decode_response};
pub use events::Event;
pub use http::{HttpIntent, Method};
pub use instance::{Instance, InstanceCore, ShardAssignments};
pub use model::{ModelCard, ShardFields, ShardMetadata};
pub use runner::{RunnerPhase, RunnerStatus};
pub use state::{
    CommandOutcome, CommandRejected, CommandStatus, InstanceFailure, InstanceInference, NodePool,
    RunnerPoolSummary, State, StateDialect,
};
pub use task::{Task, TaskStatus};
pub use topology::{Edge, Topology};
