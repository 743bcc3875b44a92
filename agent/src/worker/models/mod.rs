//! Models on a worker: download attempts, installed artifacts and runners of placed
//! instances (the worker side of den's management API).
//!
//! The router sends `place-runner` and `remove-runner` frames; the worker actor hands
//! them to [`Models`], which starts downloads ([`download`]) and loads ([`runner`]) as
//! background tasks and folds their [`ModelEvent`]s back in. What it knows goes out in
//! every heartbeat ([`Models::reports`]).
//!
//! - A download is an attempt with its own id: `Pending` → `Ongoing` (bytes, files,
//!   rate) → `Completed` after every file was verified and the installation finalized,
//!   or `Failed` with a one-line reason. Terminal reports never change afterwards; the
//!   newest [`HISTORY`] attempts are kept.
//! - An installed artifact (`DATA_DIR/models/<card digest>`, see [`install`]) is reused
//!   by later runners without a new attempt: its completion is the attempt that installed
//!   it (reported again after a restart, from the installation's marker).
//! - A runner waits for its download, then loads (`Loading` by layers), then is `Ready`
//!   and serves its model (the worker advertises it); `Running` while it has work.
//!   Removing it cancels what it waits for and releases its memory. One runner per
//!   worker: another placement meanwhile fails `runner_busy`.

pub mod download;
pub mod install;
pub mod runner;
pub mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use den_protocol::ids::{Epoch, ModelFingerprint, WorkerId};
use den_protocol::observation::{DownloadReport, DownloadStage, RunnerReport, RunnerStage};
use den_protocol::skulk::{AttemptId, RunnerId};
use den_protocol::wire::{ArtifactFormat, ModelArtifact, PlaceRunner, RemoveRunner};

use self::install::Installed;
use self::runner::{LoadError, LoadJob, Loaded, RealEngine};
use crate::router::manage::IdGen;
use crate::worker::Backend;

/// Download attempts kept in reports (terminal ones beyond this are forgotten, oldest
/// first; installations stay reported through their own attempt).
pub const HISTORY: usize = 32;

/// What background tasks report.
#[derive(Debug)]
pub enum ModelEvent {
    Progress {
        attempt: AttemptId,
        bytes_done: u64,
        files_done: u32,
        bytes_per_s: f64,
    },
    Downloaded {
        attempt: AttemptId,
        result: Result<Installed, String>,
    },
    LoadProgress {
        runner: RunnerId,
        layers_loaded: u64,
        total_layers: u64,
    },
    Loaded {
        runner: RunnerId,
        result: Box<Result<Loaded, LoadError>>,
    },
}

/// Settings of the models manager.
#[derive(Debug, Clone)]
pub struct ModelsConfig {
    /// `DATA_DIR/models`.
    pub dir: PathBuf,
    pub backend: Backend,
    pub device: usize,
    pub page_size: u32,
    /// KV page pool budget of one runner.
    pub kv_budget: u64,
    /// Threads of a placed real model's forward pass (`--model-threads`).
    pub model_threads: Option<usize>,
    /// The worker serves its own `--model-file`: a placed gguf model cannot take over.
    pub static_model: bool,
    pub worker: WorkerId,
    pub epoch: Epoch,
}

struct RunnerEntry {
    report: RunnerReport,
    place: PlaceRunner,
    cancel: Arc<AtomicBool>,
    /// A download or load is in flight for it.
    busy: bool,
    removing: bool,
    memory: Option<Loaded>,
    /// Its model is what the worker serves (a gguf runner only once the device switched
    /// to it; an opaque one as soon as it is loaded).
    serving: bool,
}

struct Active {
    digest: String,
    cancel: Arc<AtomicBool>,
}

/// The worker's downloads, installations and runners. Owned by the worker actor.
pub struct Models {
    config: ModelsConfig,
    ids: IdGen,
    events: mpsc::UnboundedSender<ModelEvent>,
    downloads: Vec<DownloadReport>,
    installed: BTreeMap<String, Installed>,
    active: BTreeMap<AttemptId, Active>,
    runners: BTreeMap<RunnerId, RunnerEntry>,
}

impl Models {
    /// Scans `config.dir` for installations (reported as completed by the attempts that
    /// installed them).
    pub fn open(
        config: ModelsConfig,
        events: mpsc::UnboundedSender<ModelEvent>,
    ) -> std::io::Result<Models> {
        let installed = install::scan(&config.dir)?;
        let downloads = installed
            .values()
            .map(|i| DownloadReport {
                attempt_id: i.marker.attempt_id.clone(),
                model_id: i.marker.model_id.clone(),
                card_digest: i.marker.card_digest.clone(),
                instance_id: None,
                stage: DownloadStage::Completed,
                bytes_done: i.marker.bytes_total,
                bytes_total: i.marker.bytes_total,
                files_done: u32::try_from(i.marker.files.len()).unwrap_or(u32::MAX),
                files_total: u32::try_from(i.marker.files.len()).unwrap_or(u32::MAX),
                bytes_per_s: 0.0,
                directory: i.dir.display().to_string(),
            })
            .collect();
        let ids = IdGen::new(&format!(
            "{}-{}-{}-{}",
            config.worker,
            config.epoch,
            std::process::id(),
            crate::router::manage::unix_now_ms()
        ));
        Ok(Models {
            config,
            ids,
            events,
            downloads,
            installed,
            active: BTreeMap::new(),
            runners: BTreeMap::new(),
        })
    }

    pub fn kv_budget(&self) -> u64 {
        self.config.kv_budget
    }

    /// `place-runner`. Idempotent for a runner id it already has.
    pub fn place(&mut self, place: PlaceRunner) {
        if self.runners.contains_key(&place.runner_id) {
            return;
        }
        let artifact = place.artifact.clone();
        let mut report = RunnerReport {
            runner_id: place.runner_id.clone(),
            instance_id: place.instance_id.clone(),
            model_id: artifact.model_id.clone(),
            card_digest: artifact.card_digest.clone(),
            stage: RunnerStage::Waiting,
            attempt_id: None,
            pool: None,
        };
        let runner = place.runner_id.clone();
        let busy = if artifact.format == ArtifactFormat::Gguf && self.config.static_model {
            Some(format!(
                "worker {} serves its own --model-file; a placed model needs a worker started without one",
                self.config.worker
            ))
        } else {
            self.runners
                .iter()
                .find(|(_, e)| !e.removing)
                .map(|(other, _)| {
                    format!(
                        "worker {} already runs runner {other} (one runner per worker)",
                        self.config.worker
                    )
                })
        };
        if let Some(message) = busy {
            report.stage = RunnerStage::Failed {
                message,
                code: "runner_busy".to_owned(),
            };
            self.insert(place, report, false);
            return;
        }
        tracing::info!(%runner, instance = %place.instance_id, model = %artifact.model_id, "placing a runner");
        if let Some(installed) = self.installed.get(&artifact.card_digest) {
            // Reuse: no new attempt; the installation's own attempt stays the record.
            report.attempt_id = Some(installed.marker.attempt_id.clone());
            self.insert(place, report, false);
            self.start_load(&runner);
            return;
        }
        let ongoing = self
            .active
            .iter()
            .find(|(_, a)| a.digest == artifact.card_digest)
            .map(|(id, _)| id.clone());
        let attempt = match ongoing {
            Some(attempt) => attempt,
            None => self.start_download(&place),
        };
        report.attempt_id = Some(attempt);
        self.insert(place, report, true);
    }

    /// `remove-runner`. Releases the runner's memory at once, or when its download or
    /// load stops (it is cancelled).
    pub fn remove(&mut self, remove: &RemoveRunner) {
        let Some(entry) = self.runners.get_mut(&remove.runner_id) else {
            return;
        };
        tracing::info!(runner = %remove.runner_id, instance = %remove.instance_id, "removing a runner");
        entry.removing = true;
        entry.cancel.store(true, Ordering::Relaxed);
        if entry.busy {
            entry.report.stage = RunnerStage::ShuttingDown;
            if let Some(attempt) = entry.report.attempt_id.clone() {
                self.cancel_unneeded(&attempt);
            }
        } else {
            self.runners.remove(&remove.runner_id);
        }
    }

    /// Cancels everything (shutdown).
    pub fn shutdown(&mut self) {
        for a in self.active.values() {
            a.cancel.store(true, Ordering::Relaxed);
        }
        for e in self.runners.values() {
            e.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Folds a background event in. Returns true when the set of ready models changed.
    pub fn on_event(&mut self, event: ModelEvent) -> bool {
        match event {
            ModelEvent::Progress {
                attempt,
                bytes_done,
                files_done,
                bytes_per_s,
            } => {
                if let Some(d) = self.download_mut(&attempt)
                    && !d.stage.is_terminal()
                {
                    d.stage = DownloadStage::Ongoing;
                    d.bytes_done = bytes_done.min(d.bytes_total);
                    d.files_done = files_done;
                    d.bytes_per_s = bytes_per_s;
                }
                false
            }
            ModelEvent::Downloaded { attempt, result } => {
                self.active.remove(&attempt);
                self.downloaded(&attempt, result);
                false
            }
            ModelEvent::LoadProgress {
                runner,
                layers_loaded,
                total_layers,
            } => {
                if let Some(e) = self.runners.get_mut(&runner)
                    && !e.removing
                {
                    e.report.stage = RunnerStage::Loading {
                        layers_loaded,
                        total_layers,
                    };
                }
                false
            }
            ModelEvent::Loaded { runner, result } => self.loaded(&runner, *result),
        }
    }

    /// Fingerprints of ready runners (the worker serves them besides its static models).
    pub fn ready_models(&self) -> BTreeSet<ModelFingerprint> {
        self.runners
            .values()
            .filter(|e| e.memory.is_some() && e.serving && !e.removing)
            .map(|e| e.place.artifact.fingerprint.clone())
            .collect()
    }

    /// A loaded gguf runner's model, for the device to switch to (taken once).
    pub fn take_engine(&mut self) -> Option<(RunnerId, RealEngine)> {
        self.runners.iter_mut().find_map(|(id, e)| {
            let engine = e.memory.as_mut().filter(|_| !e.removing)?.engine.take()?;
            Some((id.clone(), engine))
        })
    }

    /// Whether `runner` is still wanted (placed and not being removed).
    pub fn wants(&self, runner: &RunnerId) -> bool {
        self.runners.get(runner).is_some_and(|e| !e.removing)
    }

    /// The device serves `runner`'s model now: it is ready.
    pub fn set_serving(&mut self, runner: &RunnerId) {
        if let Some(e) = self.runners.get_mut(runner) {
            e.serving = true;
            e.report.stage = RunnerStage::Ready;
            tracing::info!(%runner, model = %e.place.artifact.fingerprint, "runner ready: the device serves its model");
        }
    }

    /// The device could not take `runner`'s model: it failed.
    pub fn fail_runner(&mut self, runner: &RunnerId, message: String) {
        if let Some(e) = self.runners.get_mut(runner) {
            tracing::warn!(%runner, "runner failed: {message}");
            e.memory = None;
            e.serving = false;
            e.report.pool = None;
            e.report.stage = RunnerStage::Failed {
                message,
                code: "load_failed".to_owned(),
            };
        }
    }

    /// The heartbeat's reports; a ready runner whose model has live work is `Running`.
    pub fn reports(
        &self,
        busy_models: &BTreeSet<ModelFingerprint>,
    ) -> (Vec<DownloadReport>, Vec<RunnerReport>) {
        let runners = self
            .runners
            .values()
            .map(|e| {
                let mut r = e.report.clone();
                if r.stage == RunnerStage::Ready
                    && busy_models.contains(&e.place.artifact.fingerprint)
                {
                    r.stage = RunnerStage::Running;
                }
                r
            })
            .collect();
        (self.downloads.clone(), runners)
    }

    fn insert(&mut self, place: PlaceRunner, report: RunnerReport, busy: bool) {
        self.runners.insert(
            place.runner_id.clone(),
            RunnerEntry {
                report,
                place,
                cancel: Arc::new(AtomicBool::new(false)),
                busy,
                removing: false,
                memory: None,
                serving: false,
            },
        );
    }

    fn start_download(&mut self, place: &PlaceRunner) -> AttemptId {
        let attempt = AttemptId::new(self.ids.next_id());
        let artifact = &place.artifact;
        let files = u32::try_from(artifact.files.len()).unwrap_or(u32::MAX);
        self.downloads.push(DownloadReport {
            attempt_id: attempt.clone(),
            model_id: artifact.model_id.clone(),
            card_digest: artifact.card_digest.clone(),
            instance_id: Some(place.instance_id.clone()),
            stage: DownloadStage::Pending,
            bytes_done: 0,
            bytes_total: artifact.total_bytes(),
            files_done: 0,
            files_total: files,
            bytes_per_s: 0.0,
            directory: self
                .config
                .dir
                .join(&artifact.card_digest)
                .display()
                .to_string(),
        });
        self.trim_history();
        let cancel = Arc::new(AtomicBool::new(false));
        self.active.insert(
            attempt.clone(),
            Active {
                digest: artifact.card_digest.clone(),
                cancel: Arc::clone(&cancel),
            },
        );
        tracing::info!(%attempt, model = %artifact.model_id, source = %place.source, "download attempt started");
        tokio::spawn(download::run(download::DownloadJob {
            attempt: attempt.clone(),
            artifact: artifact.clone(),
            source: place.source.clone(),
            models_dir: self.config.dir.clone(),
            cancel,
            events: self.events.clone(),
        }));
        attempt
    }

    /// Cancels `attempt` when no runner that is not being removed waits for it.
    fn cancel_unneeded(&mut self, attempt: &AttemptId) {
        let needed = self
            .runners
            .values()
            .any(|e| !e.removing && e.report.attempt_id.as_ref() == Some(attempt));
        if !needed && let Some(a) = self.active.get(attempt) {
            a.cancel.store(true, Ordering::Relaxed);
        }
    }

    fn downloaded(&mut self, attempt: &AttemptId, result: Result<Installed, String>) {
        let waiting: Vec<RunnerId> = self
            .runners
            .iter()
            .filter(|(_, e)| e.busy && e.memory.is_none() && e.report.stage == RunnerStage::Waiting)
            .filter(|(_, e)| e.report.attempt_id.as_ref() == Some(attempt))
            .map(|(id, _)| id.clone())
            .chain(
                self.runners
                    .iter()
                    .filter(|(_, e)| e.removing && e.report.attempt_id.as_ref() == Some(attempt))
                    .map(|(id, _)| id.clone()),
            )
            .collect();
        match result {
            Ok(installed) => {
                tracing::info!(%attempt, dir = %installed.dir.display(), "download completed and installed");
                if let Some(d) = self.download_mut(attempt) {
                    d.stage = DownloadStage::Completed;
                    d.bytes_done = d.bytes_total;
                    d.files_done = d.files_total;
                }
                self.installed
                    .insert(installed.marker.card_digest.clone(), installed);
                for runner in waiting {
                    if self.runners.get(&runner).is_some_and(|e| e.removing) {
                        self.runners.remove(&runner);
                    } else {
                        self.start_load(&runner);
                    }
                }
            }
            Err(reason) => {
                tracing::warn!(%attempt, "download failed: {reason}");
                if let Some(d) = self.download_mut(attempt) {
                    d.stage = DownloadStage::Failed {
                        reason: reason.clone(),
                    };
                }
                for runner in waiting {
                    let Some(e) = self.runners.get_mut(&runner) else {
                        continue;
                    };
                    if e.removing {
                        self.runners.remove(&runner);
                        continue;
                    }
                    e.busy = false;
                    e.report.stage = RunnerStage::Failed {
                        message: format!("download attempt {attempt} failed: {reason}"),
                        code: "download_failed".to_owned(),
                    };
                }
            }
        }
    }

    fn start_load(&mut self, runner: &RunnerId) {
        let Some(entry) = self.runners.get_mut(runner) else {
            return;
        };
        let Some(installed) = self.installed.get(&entry.place.artifact.card_digest) else {
            return;
        };
        entry.busy = true;
        let layers = u64::from(entry.place.artifact.layers);
        entry.report.stage = RunnerStage::Loading {
            layers_loaded: 0,
            total_layers: layers,
        };
        let job = LoadJob {
            runner: runner.clone(),
            dir: installed.dir.clone(),
            artifact: entry.place.artifact.clone(),
            backend: self.config.backend,
            device: self.config.device,
            page_size: self.config.page_size,
            kv_budget: self.config.kv_budget,
            threads: self.config.model_threads,
            cancel: Arc::clone(&entry.cancel),
            events: self.events.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let result = runner::load(&job);
            let _ = job.events.send(ModelEvent::Loaded {
                runner: job.runner.clone(),
                result: Box::new(result),
            });
        });
    }

    fn loaded(&mut self, runner: &RunnerId, result: Result<Loaded, LoadError>) -> bool {
        let Some(entry) = self.runners.get_mut(runner) else {
            return false;
        };
        entry.busy = false;
        if entry.removing {
            // Dropping the result releases whatever was allocated.
            self.runners.remove(runner);
            return false;
        }
        match result {
            Ok(loaded) => {
                entry.report.pool = Some(loaded.pool);
                if let Some(engine) = &loaded.engine {
                    // Ready once the device switched to it (the worker actor takes it).
                    tracing::info!(%runner, pool = ?loaded.pool, model = %engine.model.fingerprint(), probe = ?engine.probe, "runner loaded and probed");
                } else {
                    tracing::info!(%runner, pool = ?loaded.pool, "runner ready");
                    entry.report.stage = RunnerStage::Ready;
                    entry.serving = true;
                }
                entry.memory = Some(loaded);
                true
            }
            Err(e) => {
                tracing::warn!(%runner, "loading failed: {e}");
                entry.report.stage = RunnerStage::Failed {
                    message: format!("loading failed: {e}"),
                    code: "load_failed".to_owned(),
                };
                if let LoadError::Corrupt(_) = e {
                    let digest = entry.place.artifact.card_digest.clone();
                    if let Some(gone) = self.installed.remove(&digest) {
                        install::uninstall(&gone.dir);
                    }
                }
                false
            }
        }
    }

    fn download_mut(&mut self, attempt: &AttemptId) -> Option<&mut DownloadReport> {
        self.downloads
            .iter_mut()
            .rev()
            .find(|d| &d.attempt_id == attempt)
    }

    /// Keeps at most [`HISTORY`] reports, forgetting the oldest terminal ones first.
    fn trim_history(&mut self) {
        while self.downloads.len() > HISTORY {
            let Some(i) = self.downloads.iter().position(|d| {
                d.stage.is_terminal()
                    && !self
                        .installed
                        .values()
                        .any(|i| i.marker.attempt_id == d.attempt_id)
            }) else {
                break;
            };
            self.downloads.remove(i);
        }
    }

    /// The artifact of a runner (tests, status).
    pub fn artifact_of(&self, runner: &RunnerId) -> Option<&ModelArtifact> {
        self.runners.get(runner).map(|e| &e.place.artifact)
    }
}

#[cfg(test)]
mod tests;
