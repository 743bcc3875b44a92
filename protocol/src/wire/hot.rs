//! The frames each side receives on every request, read in one pass straight into their
//! types instead of through a JSON tree first (well under half the cost): at the router,
//! heartbeats (one per worker per interval), offer results, token deltas, results and the
//! publications and retractions of the chunks a request leaves; at a worker, offers. Only
//! a frame that is valid is decoded here; anything else returns
//! `None` and takes the field-by-field path in `codec`, which names what was wrong — so
//! the errors and the accepted frames are exactly that path's. Fields other than the
//! type's are skipped, as that path ignores them.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::codec::{
    check_offer, check_offer_result, check_publish, check_result, valid_assignment,
};
use super::{
    Heartbeat, Offer, OfferResult, Publish, PublishedChunk, ResultMessage, Retract, RetractedChunk,
    RouterMessage, ToRouter, TokenDelta, WorkerInbound, WorkerResult,
};
use crate::candidate::{Candidate, Estimate};
use crate::capacity::DeclineReason;
use crate::ids::{AssignmentId, Epoch, WorkerId};
use crate::observation::Observation;
use crate::request::{GenerationRequest, Token};

/// The frame types read here. Any other type fails the typed pass the moment its `type`
/// is read — den's peers write it first (`den_writes_a_frames_type_first`) — so a frame
/// of another type is not scanned whole here before the field-by-field path parses it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RouterHot {
    Heartbeat,
    Token,
    OfferResult,
    Result,
    Publish,
    Retract,
}

#[derive(serde::Deserialize)]
struct RouterFrame<'a> {
    #[serde(rename = "type")]
    ty: RouterHot,
    observation: Option<Observation>,
    assignment: Option<AssignmentId>,
    token: Option<Token>,
    index: Option<u32>,
    worker_epoch: Option<Epoch>,
    accepted: Option<bool>,
    reason: Option<DeclineReason>,
    result: Option<Box<WorkerResult>>,
    /// A publication's or a retraction's chunks, typed once the frame's type is known.
    #[serde(borrow)]
    chunks: Option<&'a RawValue>,
}

pub(super) fn for_router(bytes: &[u8]) -> Option<ToRouter> {
    let f: RouterFrame = serde_json::from_slice(bytes).ok()?;
    match f.ty {
        RouterHot::Heartbeat => Some(ToRouter::Heartbeat(Box::new(Heartbeat {
            observation: f.observation?,
        }))),
        RouterHot::Token => {
            let assignment = f.assignment?;
            valid_assignment(&assignment).ok()?;
            Some(ToRouter::Token(TokenDelta {
                assignment,
                token: f.token?,
                index: f.index?,
            }))
        }
        RouterHot::OfferResult => {
            let r = OfferResult {
                assignment: f.assignment?,
                worker_epoch: f.worker_epoch?,
                accepted: f.accepted?,
                reason: f.reason,
            };
            valid_assignment(&r.assignment).ok()?;
            check_offer_result(&r).ok()?;
            Some(ToRouter::OfferResult(r))
        }
        RouterHot::Result => {
            let assignment = f.assignment?;
            valid_assignment(&assignment).ok()?;
            let result = f.result?;
            check_result(&result).ok()?;
            Some(ToRouter::Result(ResultMessage { assignment, result }))
        }
        RouterHot::Publish => {
            let chunks: Vec<PublishedChunk> = serde_json::from_str(f.chunks?.get()).ok()?;
            check_publish(&chunks).ok()?;
            Some(ToRouter::Publish(Publish { chunks }))
        }
        RouterHot::Retract => {
            let chunks: Vec<RetractedChunk> = serde_json::from_str(f.chunks?.get()).ok()?;
            Some(ToRouter::Retract(Retract { chunks }))
        }
    }
}

/// The one frame type read here; as at the router, any other leaves at its `type`, which
/// den writes right after the addressee (`den_writes_a_frames_type_first`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum WorkerHot {
    Offer,
}

#[derive(serde::Deserialize)]
struct WorkerFrame<'a> {
    #[serde(rename = "type")]
    ty: WorkerHot,
    #[serde(borrow)]
    to: Cow<'a, str>,
    assignment: AssignmentId,
    worker_epoch: Epoch,
    request: GenerationRequest,
    candidate: Candidate,
    estimate: Estimate,
}

/// An offer addressed to `me`.
pub(super) fn for_worker(bytes: &[u8], me: &WorkerId) -> Option<WorkerInbound> {
    let f: WorkerFrame = serde_json::from_slice(bytes).ok()?;
    let WorkerHot::Offer = f.ty;
    if f.to != me.as_str() {
        return None;
    }
    let offer = Offer {
        assignment: f.assignment,
        worker_epoch: f.worker_epoch,
        request: Arc::new(f.request),
        candidate: f.candidate,
        estimate: f.estimate,
    };
    valid_assignment(&offer.assignment).ok()?;
    check_offer(&offer).ok()?;
    Some(WorkerInbound::Router(RouterMessage::Offer(Box::new(offer))))
}
