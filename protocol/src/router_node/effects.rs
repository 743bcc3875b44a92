//! Interpreting the composed machines' effects: the router machine's sends, timers and
//! deliveries become node effects (and the in-flight ledger, speculation and the wait
//! queue learn from them); discovery's updates and detaches do the same.

use super::*;

impl RouterNode {
    /// Every router input queued so far, and whatever their effects feed back.
    pub(super) fn drain(&mut self, now: Millis, out: &mut Vec<NodeEffect>) {
        while let Some(input) = self.pending.pop_front() {
            let effects = self.router.handle(now, input);
            self.apply_router(effects, out);
        }
    }

    pub(super) fn apply_router(&mut self, effects: Vec<RouterEffect>, out: &mut Vec<NodeEffect>) {
        for effect in effects {
            match effect {
                RouterEffect::Send(frame) => {
                    let Some(conn) = self.discovery.route(&frame.to) else {
                        if let RouterMessage::Offer(o) = &frame.message {
                            // Fast fallback: no live route, no waiting for the timer.
                            out.push(NodeEffect::Count(Count::OfferWithoutRoute));
                            self.pending.push_back(RouterInput::WorkerUnavailable {
                                worker: frame.to.clone(),
                                assignment: o.assignment.clone(),
                            });
                        }
                        continue; // a cancel for a worker without a route: nothing to tell
                    };
                    if let RouterMessage::Offer(o) = &frame.message {
                        let work = added_work_ms(&o.candidate, &o.estimate);
                        let pages = u64::from(o.estimate.required_pages);
                        self.unreflected
                            .offered(&frame.to, o.assignment.clone(), work, pages);
                    }
                    out.push(NodeEffect::Send { conn, frame });
                }
                RouterEffect::Local(local) => match local {
                    LocalRouterEffect::SetOfferTimer { assignment, at } => {
                        out.push(NodeEffect::SetTimer {
                            timer: Timer::Offer(assignment),
                            at,
                        })
                    }
                    LocalRouterEffect::CancelOfferTimer { assignment } => {
                        out.push(NodeEffect::CancelTimer(TimerKey::Offer(assignment)))
                    }
                    LocalRouterEffect::SetDeadlineTimer { request, at } => {
                        out.push(NodeEffect::SetTimer {
                            timer: Timer::Deadline(request),
                            at,
                        })
                    }
                    LocalRouterEffect::CancelDeadlineTimer { request } => {
                        out.push(NodeEffect::CancelTimer(TimerKey::Deadline(request)))
                    }
                    LocalRouterEffect::Deliver(d) => {
                        self.delivered(&d);
                        out.push(NodeEffect::Deliver(d));
                    }
                    LocalRouterEffect::Decision(e) => out.push(NodeEffect::Decision(e)),
                },
            }
        }
    }

    /// Bookkeeping of a delivery: a completed route is guessed resident on its worker;
    /// a terminal one ends the request's offered work, or its wait for pages (cancelled
    /// or past its deadline while waiting: the next oldest may reserve a worker now).
    pub(super) fn delivered(&mut self, d: &Delivery) {
        if !d.is_terminal() {
            return;
        }
        if self.waiting.remove(&d.request).is_some() {
            self.rescan = true;
        }
        let request = self.live.remove(&d.request);
        if matches!(d.kind, DeliveryKind::Completed { .. })
            && let Some(request) = request
            && let Some(worker) = self
                .router
                .record(&d.request)
                .and_then(|r| r.chosen())
                .map(|a| a.worker.clone())
            && let Some(obs) = self.discovery.registry().get(&worker)
        {
            self.speculation.completed(obs, &request, self.chunk_size);
        }
        self.unreflected.ended(&d.request);
    }

    pub(super) fn apply_discovery(
        &mut self,
        effects: Vec<DiscoveryEffect>,
        out: &mut Vec<NodeEffect>,
    ) {
        for effect in effects {
            match effect {
                DiscoveryEffect::Updated { worker, .. } => {
                    // The heartbeat says what really is resident: drop the guesses.
                    self.speculation.forget(&worker);
                    out.push(NodeEffect::Count(Count::HeartbeatAccepted));
                    out.push(NodeEffect::WorkerUpdated(worker));
                }
                DiscoveryEffect::ArmExpiry {
                    worker,
                    connection,
                    version,
                    at,
                } => out.push(NodeEffect::SetTimer {
                    timer: Timer::Expiry {
                        worker,
                        connection,
                        version,
                    },
                    at,
                }),
                DiscoveryEffect::Detached {
                    worker,
                    connection,
                    reason,
                } => {
                    self.speculation.forget(&worker);
                    self.rescan = true;
                    self.recheck = true;
                    out.push(NodeEffect::CancelTimer(TimerKey::Expiry(worker.clone())));
                    self.pending.extend(self.router.unavailable_inputs(&worker));
                    // A worker that merely missed heartbeats may come back on the same
                    // connection with its tiers intact (it republishes only on
                    // reconnect), so only a lost connection drops the node's replicas.
                    // Stale replicas of a dead node are harmless: candidates come from
                    // live workers only, and a missing chunk is retracted and recomputed.
                    let lost = reason != DetachReason::HeartbeatExpired;
                    if lost
                        && let Some(peer) = self.peers.get(&connection)
                        && !self
                            .discovery
                            .registry()
                            .observations()
                            .any(|o| o.node == peer.node)
                    {
                        self.catalog.remove_node(&peer.node);
                    }
                    if reason == DetachReason::SendFailed {
                        self.unreflected.forget(&worker);
                    }
                    out.push(NodeEffect::WorkerDetached {
                        worker,
                        connection,
                        reason,
                    });
                }
                DiscoveryEffect::Ignored {
                    worker,
                    version,
                    why,
                } => out.push(NodeEffect::Count(Count::HeartbeatIgnored {
                    worker,
                    version,
                    why,
                })),
            }
        }
    }
}
