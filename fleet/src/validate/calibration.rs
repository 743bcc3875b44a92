//! What the real workers measured of themselves: their heartbeats (sampled through the
//! run and at its end), the bytes their metrics say they moved, and the profile the
//! simulator's workers take from both (`den-fleet validate --model-file`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use den_agent::metrics::read_value;

use crate::synthetic::MeasuredRates;
use crate::{SyntheticEngine, SyntheticProfile};
use den_protocol::candidate::Tier;
use den_protocol::engine_plan::StepCosts;
use den_protocol::observation::Observation;

/// How often the workers' measured costs are sampled through a real-model run.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What one worker measured of its own costs (its last heartbeat), against which the
/// profile's declared costs can be read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerCalibration {
    pub worker: String,
    /// Measured prefill cost per token (EWMA), ms.
    pub prefill_ms_per_token: f64,
    /// Measured first-token cost (EWMA), ms.
    pub first_token_ms: f64,
    /// Measured RAM-tier read throughput, bytes/ms (absent: the worker read nothing
    /// from its RAM tier, so its heartbeat's rate is a default).
    pub ram_read_bytes_per_ms: Option<f64>,
    /// Measured SSD-tier read throughput, bytes/ms (absent as for RAM).
    pub ssd_read_bytes_per_ms: Option<f64>,
    /// Measured host → page upload throughput, bytes/ms (absent: nothing uploaded).
    pub upload_bytes_per_ms: Option<f64>,
    /// What the worker moved, from its metrics.
    pub moved: Moved,
}

/// The workers' last heartbeats as the router holds them (empty when unreachable).
pub async fn observations(router: &str) -> Vec<Observation> {
    let url = format!("{}/v1/workers", router.trim_end_matches('/'));
    let Ok(resp) = reqwest::get(&url).await else {
        return Vec::new();
    };
    resp.json().await.unwrap_or_default()
}

/// Every second until aborted, the workers' heartbeats that carry measured step costs,
/// appended to `into` (the fits of a whole run, `measured_profile`'s input).
pub async fn sample_observations(router: String, into: Arc<Mutex<Vec<Observation>>>) {
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let now: Vec<Observation> = observations(&router)
            .await
            .into_iter()
            .filter(|o| {
                o.engine
                    .as_ref()
                    .is_some_and(|e| matches!(e.costs, StepCosts::Fitted { .. }))
            })
            .collect();
        if let Ok(mut v) = into.lock() {
            v.extend(now);
        }
    }
}

/// What each worker reports of its own costs; a rate only where `moved` shows the worker
/// measured it.
pub fn calibration(
    observations: &[Observation],
    moved: &BTreeMap<String, Moved>,
) -> Vec<WorkerCalibration> {
    observations
        .iter()
        .map(|o| {
            let worker = o.worker_id.to_string();
            let m = moved.get(&worker).copied().unwrap_or_default();
            // A rate only where bytes moved that way (else it is the worker's default).
            let measured =
                |bytes: u64, v: Option<f64>| v.filter(|v| bytes > 0 && v.is_finite() && *v > 0.0);
            let rate = |tier: Tier, bytes: u64| {
                measured(bytes, o.tier_throughput_bytes_per_ms.get(&tier).copied())
            };
            WorkerCalibration {
                prefill_ms_per_token: o.prefill_ms_per_token,
                first_token_ms: o.first_token_ms,
                ram_read_bytes_per_ms: rate(Tier::Ram, m.ram_read_bytes),
                ssd_read_bytes_per_ms: rate(Tier::Ssd, m.ssd_read_bytes),
                upload_bytes_per_ms: measured(m.upload_bytes, Some(o.gpu_restore_bytes_per_ms)),
                moved: m,
                worker,
            }
        })
        .collect()
}

/// Bytes one worker moved through the run, from its metrics at the end: which of the
/// rates its heartbeats carry it measured, and which are still its defaults (a worker
/// reports a default rate for a tier it never read from).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Moved {
    pub ram_read_bytes: u64,
    pub ssd_read_bytes: u64,
    /// Checkpoints written into the SSD tier.
    pub ssd_write_bytes: u64,
    /// Host buffer → page arena (restores).
    pub upload_bytes: u64,
}

impl Moved {
    /// Reads the counters out of a worker's `/metrics` text (`den_tier_io_bytes_total`,
    /// `den_transfer_bytes_total`); a missing or unreadable counter is 0.
    pub fn parse(metrics: &str) -> Moved {
        let bytes = |name, labels: &[(&str, &str)]| {
            read_value(metrics, name, labels)
                .filter(|v| v.is_finite() && *v > 0.0)
                .map_or(0, |v| v as u64)
        };
        let io = |tier, direction| {
            bytes(
                "den_tier_io_bytes_total",
                &[("tier", tier), ("direction", direction)],
            )
        };
        Moved {
            ram_read_bytes: io("ram", "read"),
            ssd_read_bytes: io("ssd", "read"),
            ssd_write_bytes: io("ssd", "write"),
            upload_bytes: bytes("den_transfer_bytes_total", &[("direction", "upload")]),
        }
    }
}

/// What each worker of `workers` moved (by worker name); a worker whose metrics cannot
/// be read is left out, so its rates count as unmeasured.
pub async fn moved(workers: &[den_agent::local_cluster::LocalWorker]) -> BTreeMap<String, Moved> {
    let mut out = BTreeMap::new();
    for w in workers {
        let url = format!("{}/metrics", w.metrics_url.trim_end_matches('/'));
        let Ok(resp) = reqwest::get(&url).await else {
            continue;
        };
        if let Ok(text) = resp.text().await {
            out.insert(w.name.clone(), Moved::parse(&text));
        }
    }
    out
}

/// `base` with what real-model workers measured and reported in their heartbeats: their
/// step costs (the mean of each term over `samples`, heartbeats taken through the run
/// from workers that run the same model on the same host), their pool (pages, page size,
/// bytes per KV row), and the restore rates each measured by the end of the run
/// (`workers`, from `calibration`: a rate only where the worker moved bytes that way):
/// the RAM path and the SSD tier's read. What no worker measured keeps `base`'s value,
/// and [`SyntheticProfile::rates`] records which are measured. Errors when a worker has
/// published no measured steps yet.
pub fn measured_profile(
    base: &SyntheticProfile,
    samples: &[Observation],
    workers: &[WorkerCalibration],
) -> Result<SyntheticProfile, String> {
    if samples.is_empty() {
        return Err("no worker observation to read measured costs from".into());
    }
    let mut sum = [0.0f64; 4];
    let mut batch_tokens = u32::MAX;
    for o in samples {
        let plan = o.engine.as_ref().ok_or_else(|| {
            format!(
                "worker {} published no engine plan: it has measured no steps",
                o.worker_id
            )
        })?;
        let StepCosts::Fitted {
            step_us,
            row_us,
            attention_us_per_position,
            context_us_per_token,
        } = plan.costs
        else {
            return Err(format!(
                "worker {} publishes declared step costs, not measured ones: is it running a model?",
                o.worker_id
            ));
        };
        for (s, v) in sum.iter_mut().zip([
            step_us,
            row_us,
            attention_us_per_position,
            context_us_per_token,
        ]) {
            *s += v;
        }
        batch_tokens = batch_tokens.min(plan.max_batched_tokens.max(1));
    }
    let n = samples.len() as f64;
    let [
        step_us,
        row_us,
        attention_us_per_position,
        context_us_per_token,
    ] = sum.map(|s| s / n);
    let pages = samples
        .iter()
        .map(|o| o.pool.total_pages)
        .min()
        .unwrap_or(base.pages);
    let page_size = samples[0].page_size.max(1);
    let kv_bytes_per_token = (samples[0].pool.page_bytes / page_size as u64).max(1);
    let rates = measured_rates(workers);
    let costs = StepCosts::Fitted {
        step_us,
        row_us,
        attention_us_per_position,
        context_us_per_token,
    };
    // The declared fields, read from the fit (what the study's older estimates read).
    let engine = SyntheticEngine::measured(costs, base.restore_chunk_ms, base.capture_bytes_per_s);
    Ok(SyntheticProfile {
        prefill_ms_per_token: engine.prefill_ms_per_token,
        first_token_ms: engine.first_token_ms,
        decode_ms_per_token: engine.decode_ms_per_token,
        pages,
        page_size,
        kv_bytes_per_token,
        batch_tokens: if batch_tokens == u32::MAX {
            base.batch_tokens
        } else {
            batch_tokens
        },
        restore_bytes_per_s: rates
            .restore_bytes_per_s
            .unwrap_or(base.restore_bytes_per_s),
        ssd_read_bytes_per_s: rates
            .ssd_read_bytes_per_s
            .unwrap_or(base.ssd_read_bytes_per_s),
        measured: Some(costs),
        rates,
        ..base.clone()
    })
}

/// The mean over workers of each rate they measured (bytes/s; `None`: none did). The
/// RAM path is a RAM-tier read, then the upload into pages, one after the other.
fn measured_rates(workers: &[WorkerCalibration]) -> MeasuredRates {
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let ram = workers
        .iter()
        .filter_map(|c| Some(1e3 / (1.0 / c.ram_read_bytes_per_ms? + 1.0 / c.upload_bytes_per_ms?)))
        .collect();
    let ssd = workers
        .iter()
        .filter_map(|c| Some(c.ssd_read_bytes_per_ms? * 1e3))
        .collect();
    MeasuredRates {
        restore_bytes_per_s: mean(ram),
        ssd_read_bytes_per_s: mean(ssd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::engine_plan::EnginePlan;

    fn fitted(step_us: f64, row_us: f64) -> StepCosts {
        StepCosts::Fitted {
            step_us,
            row_us,
            attention_us_per_position: 8.0,
            context_us_per_token: 0.5,
        }
    }

    fn worker(id: &str, costs: StepCosts, pages: u32) -> Observation {
        let mut o = Observation::new(id, "n");
        o.engine = Some(EnginePlan::idle(64, costs));
        o.pool.total_pages = pages;
        o.pool.page_bytes = 16 * 23_040;
        o.tier_throughput_bytes_per_ms.insert(Tier::Ram, 1e6);
        o.gpu_restore_bytes_per_ms = 4e6;
        o
    }

    #[test]
    fn the_simulated_workers_take_what_the_real_ones_measured() {
        let base = SyntheticProfile::validation(32);
        let obs = [
            worker("a", fitted(60_000.0, 2_000.0), 256),
            worker("b", fitted(70_000.0, 3_000.0), 200),
        ];
        let moved = |ram: u64, ssd: u64, upload: u64| Moved {
            ram_read_bytes: ram,
            ssd_read_bytes: ssd,
            ssd_write_bytes: ssd,
            upload_bytes: upload,
        };
        let read = BTreeMap::from([
            ("a".to_owned(), moved(1 << 20, 0, 1 << 20)),
            ("b".to_owned(), moved(1 << 20, 0, 1 << 20)),
        ]);
        let p = measured_profile(&base, &obs, &calibration(&obs, &read)).unwrap();
        assert_eq!(p.measured, Some(fitted(65_000.0, 2_500.0)));
        assert_eq!(
            (p.pages, p.page_size, p.kv_bytes_per_token),
            (200, 16, 23_040)
        );
        assert_eq!(p.batch_tokens, 64);
        // A RAM read at 1 GB/s, then an upload at 4 GB/s: 0.8 GB/s end to end.
        assert!((p.restore_bytes_per_s - 0.8e9).abs() < 1.0);
        assert_eq!(p.rates.restore_bytes_per_s, Some(p.restore_bytes_per_s));
        // Nobody read the SSD tier: its rate stays the profile's, marked unmeasured.
        assert_eq!(p.ssd_read_bytes_per_s, base.ssd_read_bytes_per_s);
        assert_eq!(p.rates.ssd_read_bytes_per_s, None);
        assert_eq!(p.chunk_tokens, 32);
        // The simulator's steps cost the fit: 65 ms + 10 rows of 2.5 ms + 8 µs × 45
        // positions.
        let cost = p.cost_model();
        assert_eq!(cost.step_us(10, 45.0, 0, 0), 65_000 + 25_000 + 360);
        assert_eq!(cost.prompt_rows(10), 9);
        assert!((cost.first_token_ms() - 67.5).abs() < 1e-9);
    }

    #[test]
    fn a_worker_without_measured_steps_is_an_error_naming_it() {
        let base = SyntheticProfile::validation(32);
        let declared = StepCosts::Synthetic {
            prefill_us_per_token: 100.0,
            decode_us_per_step: 2_000.0,
            first_token_us: 5_000.0,
        };
        let obs = [
            worker("a", fitted(1.0, 1.0), 10),
            worker("w-synth", declared, 10),
        ];
        let e = measured_profile(&base, &obs, &[]).unwrap_err();
        assert!(e.contains("w-synth") && e.contains("declared"), "{e}");
        let mut silent = Observation::new("w-quiet", "n");
        silent.engine = None;
        let e = measured_profile(&base, &[silent], &[]).unwrap_err();
        assert!(e.contains("w-quiet"), "{e}");
        assert!(measured_profile(&base, &[], &[]).is_err());
    }

    #[test]
    fn a_rate_counts_only_from_a_worker_that_moved_bytes_that_way() {
        let base = SyntheticProfile::validation(32);
        let mut a = worker("a", fitted(60_000.0, 2_000.0), 256);
        a.tier_throughput_bytes_per_ms.insert(Tier::Ssd, 500e3);
        let mut b = worker("b", fitted(60_000.0, 2_000.0), 256);
        // b's heartbeat carries rates too, but they are its defaults: it read nothing.
        b.tier_throughput_bytes_per_ms.insert(Tier::Ram, 9e9);
        b.tier_throughput_bytes_per_ms.insert(Tier::Ssd, 9e9);
        let obs = [a, b];
        let moved = BTreeMap::from([
            (
                "a".to_owned(),
                Moved {
                    ram_read_bytes: 0,
                    ssd_read_bytes: 4 << 20,
                    ssd_write_bytes: 8 << 20,
                    upload_bytes: 4 << 20,
                },
            ),
            ("b".to_owned(), Moved::default()),
        ]);
        let p = measured_profile(&base, &obs, &calibration(&obs, &moved)).unwrap();
        assert_eq!(p.rates.ssd_read_bytes_per_s, Some(500e6));
        assert_eq!(p.ssd_read_bytes_per_s, 500e6);
        // No worker read its RAM tier: the RAM path keeps the profile's rate.
        assert_eq!(p.rates.restore_bytes_per_s, None);
        assert_eq!(p.restore_bytes_per_s, base.restore_bytes_per_s);
        // A worker whose metrics could not be read measured nothing either.
        let p = measured_profile(&base, &obs, &calibration(&obs, &BTreeMap::new())).unwrap();
        assert!(p.rates.is_empty());
        // The profile file says which rates were measured, and reads back the same.
        let json = serde_json::to_string(&p).unwrap();
        assert!(!json.contains("rates"), "{json}");
        let p = measured_profile(&base, &obs, &calibration(&obs, &moved)).unwrap();
        let back: SyntheticProfile =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn the_bytes_moved_are_read_from_the_workers_metrics() {
        let text = "\
# HELP den_tier_io_bytes_total Bytes read from and written to each storage tier.
# TYPE den_tier_io_bytes_total counter
den_tier_io_bytes_total{tier=\"ram\",direction=\"read\"} 1500
den_tier_io_bytes_total{tier=\"ram\",direction=\"write\"} 99999
den_tier_io_bytes_total{tier=\"ssd\",direction=\"read\"} 4.5e6
den_tier_io_bytes_total{direction=\"write\",tier=\"ssd\"} 8000
den_tier_io_bytes_total{tier=\"object\",direction=\"read\"} 777
den_transfer_bytes_total{direction=\"download\"} 12
den_transfer_bytes_total{direction=\"upload\"} 6000
den_transfer_bytes_total{direction=\"upload\",x=\"y\"} 7
garbage line
";
        assert_eq!(
            Moved::parse(text),
            Moved {
                ram_read_bytes: 1500,
                ssd_read_bytes: 4_500_000,
                ssd_write_bytes: 8000,
                upload_bytes: 6000,
            }
        );
        assert_eq!(Moved::parse(""), Moved::default());
    }
}
