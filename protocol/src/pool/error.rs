//! Why a pool operation was refused. Every refusal leaves the pool unchanged.

use super::append::AppendId;
use super::page::{Generation, Page, TransferKind};
use crate::ids::{ModelFingerprint, RouteId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("invalid page-pool geometry: {0}")]
    InvalidGeometry(&'static str),
    #[error("route {0} already exists: release it first or use another continuation id")]
    RouteExists(RouteId),
    #[error("route {0} is not resident in this pool")]
    UnknownRoute(RouteId),
    #[error("route {0} has a pending append: commit or abort it first")]
    AppendPending(RouteId),
    #[error("route {0} has no pending append to commit or abort")]
    NoPendingAppend(RouteId),
    #[error(
        "{given} is not the pending append of route {route} (pending: {pending:?}): it was committed, aborted or replaced"
    )]
    StaleAppend {
        route: RouteId,
        given: AppendId,
        pending: Option<AppendId>,
    },
    #[error("append of 0 tokens to route {0}: append at least one token")]
    EmptyAppend(RouteId),
    #[error("route {0} would exceed u32::MAX tokens")]
    TooManyTokens(RouteId),
    #[error("route {0} named twice in one batch: name each route once")]
    DuplicateEntry(RouteId),
    #[error(
        "not enough pages: {needed} needed, {available} available (free plus the route's reservation)"
    )]
    InsufficientPages { needed: u32, available: u32 },
    #[error(
        "admission needs {required} pages but only {available} can be made free (short by {shortfall})"
    )]
    Shortfall {
        required: u32,
        available: u32,
        shortfall: u32,
    },
    #[error("cannot fork {tokens} tokens of route {from}: it holds only {has}")]
    ForkTooLong {
        from: RouteId,
        tokens: u32,
        has: u32,
    },
    #[error("route {0} already has a live capacity reservation: release it before reserving again")]
    ReservationExists(RouteId),
    #[error("{0} is not a page of this pool")]
    UnknownPage(Page),
    #[error("{page} is {state}: a transfer needs a referenced page with no transfer in flight")]
    PageNotIdle { page: Page, state: &'static str },
    #[error(
        "stale transfer ticket for {page}: ticket {ticket}, page now {current}; the page was freed (maybe reused), discard the transfer"
    )]
    StaleTicket {
        page: Page,
        ticket: Generation,
        current: Generation,
    },
    #[error("no {kind:?} transfer is in flight on {page}")]
    NoTransferInFlight { page: Page, kind: TransferKind },
    #[error(
        "append to route {route} cannot commit: {page} is still loading; complete or fail the upload first"
    )]
    TransferInFlight { route: RouteId, page: Page },
    #[error("token range {start}+{count} lies outside the {limit} rows available")]
    RangeOutside { start: u32, count: u32, limit: u32 },
    #[error("route policy field {0} must be a finite number ≥ 0 (reuse_probability at most 1)")]
    InvalidPolicy(&'static str),
    #[error(
        "prefix boundary {boundary} lies outside route {route} of {tokens} tokens (must be 1..=tokens)"
    )]
    BoundaryOutsideRoute {
        route: RouteId,
        boundary: u32,
        tokens: u32,
    },
    #[error(
        "route {route} already records prefixes of model {recorded}: one route holds one model's KV"
    )]
    ModelMismatch {
        route: RouteId,
        recorded: ModelFingerprint,
    },
    #[error("route {0} is not evictable (not durable, pinned, pending, leased or in transfer)")]
    NotEvictable(RouteId),
}
