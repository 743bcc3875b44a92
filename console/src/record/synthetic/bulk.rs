//! [`Bulk`]: the endless session of the size and seek benchmarks.

use std::collections::VecDeque;

use den_protocol::decision::DecisionRecord;
use den_protocol::feed::FeedMessage;
use den_protocol::ids::RequestId;
use den_protocol::session::{SessionEvent, SourceKind, Stamped};
use den_protocol::skulk::State;
use den_protocol::time::Millis;

use super::{at, opening, state_event};
use crate::fixtures;

/// An endless, realistic stream for size and seek benchmarks: `workers` workers
/// heartbeating every second, `rate` requests per second whose decision records
/// (simulated ones, renamed) go through four changes and are collected a minute after
/// they end, and two management APIs polled every 2 s.
pub struct Bulk {
    workers: usize,
    rate: u64,
    templates: Vec<DecisionRecord>,
    state: State,
    t: u64,
    next_request: u64,
    /// Finished requests and when their record is collected.
    gone: VecDeque<(u64, RequestId)>,
    pending: VecDeque<Stamped>,
}

impl Bulk {
    pub fn new(workers: usize, rate: u64) -> Result<Bulk, String> {
        let mut pending = VecDeque::new();
        let mut opening_events = Vec::new();
        let names: Vec<String> = (0..workers).map(|i| format!("gpu-{i:03}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        opening(&mut opening_events, &refs);
        pending.extend(opening_events);
        for source in ["mgmt", "lab"] {
            pending.push_back(at(
                0,
                SessionEvent::SourceAdded {
                    source: source.into(),
                    kind: SourceKind::Skulk,
                    url: format!("http://10.0.0.9:52415/{source}"),
                },
            ));
        }
        Ok(Bulk {
            workers,
            rate: rate.max(1),
            templates: fixtures::sim_records()?,
            state: fixtures::skulk_state("derived/state_two_nodes_running.json")?,
            t: 1_000,
            next_request: 0,
            gone: VecDeque::new(),
            pending,
        })
    }

    /// One second of events.
    fn second(&mut self) {
        let t = self.t;
        let seq = t / 1_000;
        for i in 0..self.workers {
            let w = format!("gpu-{i:03}");
            let used = 20 + ((seq * 7 + i as u64 * 13) % 70) as u32;
            let mut o = fixtures::observation(&w, &format!("node-{i:03}"), 4096, used, seq);
            o.epoch = den_protocol::ids::Epoch(1);
            let when = t + (i as u64 * 997 / self.workers.max(1) as u64) % 1_000;
            self.pending.push_back(Stamped::new(
                Millis(when),
                SessionEvent::Feed {
                    source: "router".into(),
                    message: FeedMessage::Worker {
                        at: Millis(when),
                        observation: Box::new(o),
                    },
                },
            ));
        }
        let spacing = 1_000 / self.rate;
        for k in 0..self.rate {
            self.next_request += 1;
            let id = RequestId::new(format!("req-{:08}", self.next_request));
            let template = self
                .templates
                .get(self.next_request as usize % self.templates.len().max(1))
                .cloned();
            let Some(mut record) = template else {
                continue;
            };
            record.request = id.clone();
            let start = t + k * spacing;
            record.submitted_at = Millis(start);
            let worker = format!("gpu-{:03}", self.next_request % self.workers.max(1) as u64);
            for a in &mut record.attempts {
                a.worker = worker.as_str().into();
            }
            // Four changes: submitted, offered, first token, finished.
            let mut early = record.clone();
            early.outcome = None;
            early.finished_at = None;
            early.first_delta_at = None;
            early.measured_ttft_ms = None;
            early.delivered_tokens = 0;
            let mut submitted = early.clone();
            submitted.attempts.clear();
            let stages = [
                (0, submitted),
                (2, early.clone()),
                (40, early),
                (300, record),
            ];
            for (dt, r) in stages {
                self.pending.push_back(Stamped::new(
                    Millis(start + dt),
                    SessionEvent::Feed {
                        source: "router".into(),
                        message: FeedMessage::Route {
                            at: Millis(start + dt),
                            record: Box::new(r),
                        },
                    },
                ));
            }
            self.gone.push_back((start + 60_000, id));
        }
        while let Some((when, id)) = self.gone.front().cloned() {
            if when > t + 1_000 {
                break;
            }
            self.gone.pop_front();
            self.pending.push_back(Stamped::new(
                Millis(when),
                SessionEvent::Feed {
                    source: "router".into(),
                    message: FeedMessage::RouteGone {
                        at: Millis(when),
                        request: id,
                    },
                },
            ));
        }
        if seq.is_multiple_of(2) {
            for (source, dt) in [("mgmt", 10), ("lab", 20), ("router", 30)] {
                self.pending
                    .push_back(at(t + dt, state_event(source, &self.state, 5 + seq % 7)));
            }
        }
        let mut second: Vec<Stamped> = self.pending.drain(..).collect();
        second.sort_by_key(|e| e.at);
        self.pending.extend(second);
        self.t += 1_000;
    }
}

impl Iterator for Bulk {
    type Item = Stamped;

    fn next(&mut self) -> Option<Stamped> {
        if self.pending.is_empty() {
            self.second();
        }
        self.pending.pop_front()
    }
}
