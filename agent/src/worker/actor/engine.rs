//! Which engine the device runs, and switching it when a placed real model is ready or
//! removed.
//!
//! A worker's page memory, page pool and device thread are built for one row layout: the
//! synthetic engine's rows (`--kv-bytes-per-token`), or one real model's (its f16 rows).
//! A gguf runner comes loaded with its own KV arena in its model's layout
//! ([`RealEngine`]); the worker switches to it at quiescence:
//!
//! 1. it stops advertising every model (no new offers) but finishes what it accepted;
//! 2. once no assignment is live and no checkpoint is in flight, it starts a device
//!    thread on the runner's arena with the model, and only then stops the old one and
//!    replaces the page pool with one of the new geometry: resident routes go with the
//!    old pool (their chunks stay in the tiers, named by the old model's fingerprint, so
//!    nothing of the old layout can be restored into the new one; the next heartbeat
//!    advertises no GPU prefix), and
//! 4. advertises the runner's model alone: the runner is `Ready`.
//!
//! Removing that runner switches back the same way, to the engine the worker started
//! with. A device that cannot start fails the runner and keeps the old engine.
//!
//! Switching blocks the actor while the new device thread loads the model (a map and
//! shape checks: milliseconds) and the old one stops (it is idle).

use super::*;

use den_protocol::ids::ModelFingerprint;
use den_protocol::pool::{Geometry, PagePool};
use den_protocol::skulk::RunnerId;

use crate::memory::{ArenaGeometry, HostMemory, PageMemory};
use crate::worker::device::{self, DeviceContext};
use crate::worker::models::runner::RealEngine;

/// What the device serves now.
#[derive(Debug, Clone)]
pub struct EngineState {
    /// Bytes of one token's KV row in the pages.
    pub row_bytes: u64,
    /// Largest context admitted.
    pub max_context: u32,
    /// Models served besides ready opaque runners (the worker's own).
    pub statics: Vec<ModelFingerprint>,
    /// The placed gguf runner whose model the device runs.
    pub runner: Option<RunnerId>,
}

impl EngineState {
    /// The engine the worker was started with.
    pub fn initial(opts: &WorkerOptions) -> EngineState {
        EngineState {
            row_bytes: opts.kv_bytes_per_token,
            max_context: opts
                .max_context
                .unwrap_or_else(|| opts.pages.saturating_mul(opts.page_size))
                .max(1),
            statics: opts.models.clone(),
            runner: None,
        }
    }
}

/// A switch waiting for quiescence.
pub enum Switch {
    To {
        runner: RunnerId,
        engine: RealEngine,
    },
    Back,
}

impl Actor {
    /// After runner changes: a loaded gguf runner to switch to, or the served one gone.
    pub(super) fn plan_switch(&mut self) {
        if let Some(served) = &self.engine.runner
            && !self.p.models.wants(served)
            && !matches!(self.switch, Some(Switch::Back))
        {
            tracing::info!(runner = %served, "the served runner was removed: switching back to the worker's own engine");
            self.switch = Some(Switch::Back);
        }
        if let Some((runner, engine)) = self.p.models.take_engine() {
            tracing::info!(%runner, model = %engine.model.fingerprint(), "switching the device to a placed model once in-flight work is done");
            self.switch = Some(Switch::To { runner, engine });
        }
        if let Some(Switch::To { runner, .. }) = &self.switch
            && !self.p.models.wants(runner)
        {
            // Removed before the switch: its arena is dropped here.
            self.switch = if self.engine.runner.is_some() {
                Some(Switch::Back)
            } else {
                None
            };
        }
        self.try_switch();
    }

    /// Switches when nothing is in flight.
    pub(super) fn try_switch(&mut self) {
        if self.switch.is_none() || !self.machine_idle() || self.checkpoints > 0 {
            return;
        }
        let Some(switch) = self.switch.take() else {
            return;
        };
        match switch {
            Switch::To { runner, engine } => {
                let RealEngine {
                    model,
                    memory,
                    pages,
                    context_tokens,
                    ..
                } = engine;
                let row_bytes = model.row_bytes();
                let fingerprint = model.fingerprint().clone();
                match self.replace_device(memory, Some(model), pages, row_bytes) {
                    Ok(()) => {
                        self.engine = EngineState {
                            row_bytes,
                            max_context: context_tokens.max(1),
                            statics: Vec::new(),
                            runner: Some(runner.clone()),
                        };
                        self.p.models.set_serving(&runner);
                        tracing::info!(%runner, model = %fingerprint, pages, "the device serves the placed model");
                    }
                    Err(e) => self
                        .p
                        .models
                        .fail_runner(&runner, format!("the device could not start it: {e}")),
                }
            }
            Switch::Back => {
                let o = Arc::clone(&self.p.opts);
                let memory = ArenaGeometry::new(o.page_size, o.pages, o.kv_bytes_per_token)
                    .and_then(HostMemory::open)
                    .map(|m| Box::new(m) as Box<dyn PageMemory>);
                let result = memory
                    .map_err(|e| e.to_string())
                    .and_then(|m| self.replace_device(m, None, o.pages, o.kv_bytes_per_token));
                match result {
                    Ok(()) => {
                        self.engine = EngineState::initial(&o);
                        tracing::info!("the device runs the worker's own engine again");
                    }
                    Err(e) => {
                        // The old device stays (its model's runner is gone, so nothing is
                        // offered for it); the worker serves nothing until restarted.
                        tracing::error!("cannot switch back to the worker's own engine: {e}");
                        self.engine.statics.clear();
                        self.engine.runner = None;
                    }
                }
            }
        }
        self.models_changed();
        self.heartbeat();
    }

    /// Starts a device thread on `memory`, then stops the old one and replaces the pool
    /// (no assignment holds pages: the machine is idle).
    fn replace_device(
        &mut self,
        memory: Box<dyn PageMemory>,
        model: Option<crate::model_file::ModelFile>,
        pages: u32,
        row_bytes: u64,
    ) -> Result<(), String> {
        let page_size = self.p.opts.page_size;
        let mut ctx: DeviceContext = self.p.device_ctx.clone();
        ctx.config.row_bytes = row_bytes;
        let pool = PagePool::new(Geometry::new(
            page_size,
            pages,
            u64::from(page_size) * row_bytes,
        ))
        .map_err(|e| e.to_string())?;
        self.p.backend = memory.describe();
        let new = device::spawn(memory, ctx, model, self.p.opts.model_threads)?;
        let mut old = std::mem::replace(&mut self.p.device, new);
        old.shutdown();
        *self.p.pool.lock() = pool;
        Ok(())
    }

    /// A download, installation or runner changed: switch engines or re-advertise when
    /// the set of ready models moved.
    pub(super) fn on_model_event(&mut self, event: ModelEvent) {
        let progress_only = matches!(
            event,
            ModelEvent::Progress { .. } | ModelEvent::LoadProgress { .. }
        );
        self.p.models.on_event(event);
        if progress_only {
            // Byte and layer counts ride on the regular heartbeat.
            return;
        }
        self.plan_switch();
        self.models_changed();
    }

    /// Runners changed: advertise the static models plus every ready runner's, and tell
    /// the router soon.
    pub(super) fn models_changed(&mut self) {
        let mut models: BTreeSet<den_protocol::ids::ModelFingerprint> = BTreeSet::new();
        // While a switch waits for quiescence nothing is advertised: no new offers.
        if self.switch.is_none() {
            models.extend(self.engine.statics.iter().cloned());
            models.extend(self.p.models.ready_models());
        }
        if &models != self.p.machine.models() {
            tracing::info!(models = ?models, "serving models changed");
            let effects = self
                .p
                .machine
                .handle(self.now(), WorkerInput::SetModels { models });
            self.apply(effects);
        }
        self.heartbeat_soon();
    }
}
