//! Downloads, installations and runners against a `file://` source on disk.

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use den_protocol::ids::Epoch;
use den_protocol::skulk::InstanceId;
use den_protocol::wire::ArtifactFile;

use super::*;

fn artifact(source: &Path) -> ModelArtifact {
    let files = ["config.json", "weights/part-0.bin"]
        .iter()
        .map(|p| {
            let bytes = std::fs::read(install::file_path(source, p)).unwrap();
            ArtifactFile {
                path: (*p).to_owned(),
                bytes: bytes.len() as u64,
                sha256: hex::encode(Sha256::digest(&bytes)),
            }
        })
        .collect();
    ModelArtifact {
        model_id: "den/tiny".into(),
        fingerprint: "den/tiny".into(),
        card_digest: "d".repeat(64),
        registry_card_id: None,
        layers: 4,
        kv_bytes_per_token: 256,
        context_length: 1024,
        files,
        format: Default::default(),
    }
}

fn source_dir(root: &Path) -> std::path::PathBuf {
    let src = root.join("source");
    std::fs::create_dir_all(src.join("weights")).unwrap();
    std::fs::write(src.join("config.json"), b"{\"layers\":4}").unwrap();
    let weights: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("weights").join("part-0.bin"), weights).unwrap();
    src
}

struct Fixture {
    _tmp: tempfile::TempDir,
    source: std::path::PathBuf,
    models_dir: std::path::PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let source = source_dir(tmp.path());
    let models_dir = tmp.path().join("data").join("models");
    Fixture {
        source,
        models_dir,
        _tmp: tmp,
    }
}

fn open(f: &Fixture) -> (Models, mpsc::UnboundedReceiver<ModelEvent>) {
    open_on(f, Backend::Host)
}

fn open_on(f: &Fixture, backend: Backend) -> (Models, mpsc::UnboundedReceiver<ModelEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let models = Models::open(
        ModelsConfig {
            dir: f.models_dir.clone(),
            backend,
            device: 0,
            page_size: 16,
            kv_budget: 1 << 20,
            model_threads: None,
            static_model: false,
            worker: "w1".into(),
            epoch: Epoch(1),
        },
        tx,
    )
    .unwrap();
    (models, rx)
}

fn place(f: &Fixture, artifact: ModelArtifact, runner: &str) -> PlaceRunner {
    PlaceRunner {
        instance_id: InstanceId::from(format!("i-{runner}")),
        runner_id: runner.into(),
        artifact,
        source: format!("file://{}", f.source.display()),
    }
}

fn runner<'a>(runners: &'a [RunnerReport], id: &str) -> &'a RunnerReport {
    runners.iter().find(|r| r.runner_id.as_str() == id).unwrap()
}

/// Feeds events until the runner leaves the waiting and loading stages.
async fn settle(
    models: &mut Models,
    rx: &mut mpsc::UnboundedReceiver<ModelEvent>,
    id: &str,
) -> RunnerStage {
    loop {
        let (_, runners) = models.reports(&BTreeSet::new());
        let stage = runners
            .iter()
            .find(|r| r.runner_id.as_str() == id)
            .map(|r| r.stage.clone());
        match stage {
            Some(RunnerStage::Waiting | RunnerStage::Loading { .. }) => {}
            Some(other) => return other,
            None => return RunnerStage::ShuttingDown,
        }
        let event = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("an event within 30 s")
            .expect("the channel stays open");
        models.on_event(event);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_is_verified_installed_loaded_and_reused() {
    let f = fixture();
    let (mut models, mut rx) = open(&f);
    let a = artifact(&f.source);
    models.place(place(&f, a.clone(), "r1"));
    assert_eq!(settle(&mut models, &mut rx, "r1").await, RunnerStage::Ready);
    let (downloads, runners) = models.reports(&BTreeSet::new());
    assert_eq!(downloads.len(), 1);
    let attempt = downloads[0].attempt_id.clone();
    assert_eq!(downloads[0].stage, DownloadStage::Completed);
    assert_eq!(downloads[0].bytes_done, a.total_bytes());
    let r1 = runner(&runners, "r1");
    assert_eq!(r1.attempt_id.as_ref(), Some(&attempt));
    let pool = r1.pool.unwrap();
    assert_eq!(pool.weights_bytes, a.total_bytes());
    // 1 MiB / (16 tokens × 256 B) = 256 pages; the card caps a sequence at 1024 tokens.
    assert_eq!((pool.pages, pool.context_tokens), (256, 1024));
    assert_eq!(models.ready_models(), BTreeSet::from(["den/tiny".into()]));
    let busy = BTreeSet::from([ModelFingerprint::from("den/tiny")]);
    assert_eq!(
        runner(&models.reports(&busy).1, "r1").stage,
        RunnerStage::Running
    );
    let installed = f.models_dir.join(&a.card_digest);
    assert!(installed.join(install::MARKER).is_file());
    assert!(
        !f.models_dir
            .join(install::STAGING)
            .join(attempt.as_str())
            .exists()
    );

    // A second placement while one runs is refused on the worker too.
    models.place(place(&f, a.clone(), "r2"));
    assert!(matches!(
        &runner(&models.reports(&BTreeSet::new()).1, "r2").stage,
        RunnerStage::Failed { code, .. } if code == "runner_busy"
    ));
    models.remove(&RemoveRunner {
        instance_id: "i-r2".into(),
        runner_id: "r2".into(),
    });

    // Teardown releases the runner; the installation is reused without a new attempt.
    models.remove(&RemoveRunner {
        instance_id: "i-r1".into(),
        runner_id: "r1".into(),
    });
    assert!(models.reports(&BTreeSet::new()).1.is_empty());
    assert!(models.ready_models().is_empty());
    models.place(place(&f, a.clone(), "r3"));
    assert_eq!(settle(&mut models, &mut rx, "r3").await, RunnerStage::Ready);
    let (downloads, runners) = models.reports(&BTreeSet::new());
    assert_eq!(
        downloads.len(),
        1,
        "no new attempt for an installed artifact"
    );
    assert_eq!(runner(&runners, "r3").attempt_id.as_ref(), Some(&attempt));

    // After a restart the installation is reported by the attempt that installed it.
    drop(models);
    let (again, _rx) = open(&f);
    let (downloads, _) = again.reports(&BTreeSet::new());
    assert_eq!(downloads.len(), 1);
    assert_eq!(downloads[0].attempt_id, attempt);
    assert_eq!(downloads[0].stage, DownloadStage::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_source_file_fails_its_attempt_and_a_retry_is_a_new_attempt() {
    let f = fixture();
    let (mut models, mut rx) = open(&f);
    let a = artifact(&f.source);
    let weights = f.source.join("weights").join("part-0.bin");
    let good = std::fs::read(&weights).unwrap();
    let mut bad = good.clone();
    bad[1000] ^= 0xff;
    std::fs::write(&weights, &bad).unwrap();
    models.place(place(&f, a.clone(), "r1"));
    let stage = settle(&mut models, &mut rx, "r1").await;
    match &stage {
        RunnerStage::Failed { message, code } => {
            assert_eq!(code, "download_failed");
            assert!(
                message.contains("checksum mismatch for weights/part-0.bin"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    let (downloads, _) = models.reports(&BTreeSet::new());
    let first = downloads[0].attempt_id.clone();
    assert!(
        matches!(&downloads[0].stage, DownloadStage::Failed { reason } if reason.contains("expected sha256"))
    );
    assert!(
        !f.models_dir.join(&a.card_digest).exists(),
        "nothing installed"
    );
    let staging = f.models_dir.join(install::STAGING);
    assert!(
        !staging.join(first.as_str()).exists(),
        "partial files removed"
    );

    std::fs::write(&weights, &good).unwrap();
    models.remove(&RemoveRunner {
        instance_id: "i-r1".into(),
        runner_id: "r1".into(),
    });
    models.place(place(&f, a.clone(), "r2"));
    assert_eq!(settle(&mut models, &mut rx, "r2").await, RunnerStage::Ready);
    let (downloads, _) = models.reports(&BTreeSet::new());
    assert_eq!(downloads.len(), 2);
    assert_eq!(downloads[0].attempt_id, first);
    assert!(
        matches!(downloads[0].stage, DownloadStage::Failed { .. }),
        "terminal reports never change"
    );
    assert_ne!(downloads[1].attempt_id, first);
    assert_eq!(downloads[1].stage, DownloadStage::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_changed_on_disk_is_refused_and_uninstalled() {
    let f = fixture();
    let (mut models, mut rx) = open(&f);
    let a = artifact(&f.source);
    models.place(place(&f, a.clone(), "r1"));
    assert_eq!(settle(&mut models, &mut rx, "r1").await, RunnerStage::Ready);
    models.remove(&RemoveRunner {
        instance_id: "i-r1".into(),
        runner_id: "r1".into(),
    });
    let installed = f.models_dir.join(&a.card_digest);
    std::fs::write(
        install::file_path(&installed, "config.json"),
        b"{\"layers\":5}",
    )
    .unwrap();
    models.place(place(&f, a.clone(), "r2"));
    match settle(&mut models, &mut rx, "r2").await {
        RunnerStage::Failed { code, message } => {
            assert_eq!(code, "load_failed");
            assert!(message.contains("changed on disk"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!installed.exists(), "the next placement downloads it again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_source_file_and_a_too_small_budget_fail_with_reasons() {
    let f = fixture();
    let (mut models, mut rx) = open(&f);
    let mut a = artifact(&f.source);
    a.files.push(ArtifactFile {
        path: "absent.bin".into(),
        bytes: 1,
        sha256: "0".repeat(64),
    });
    models.place(place(&f, a, "r1"));
    match settle(&mut models, &mut rx, "r1").await {
        RunnerStage::Failed { message, .. } => {
            assert!(
                message.contains("absent.bin is missing from the source"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    models.remove(&RemoveRunner {
        instance_id: "i-r1".into(),
        runner_id: "r1".into(),
    });
    let mut huge = artifact(&f.source);
    huge.kv_bytes_per_token = 1 << 20;
    huge.card_digest = "e".repeat(64);
    models.place(place(&f, huge, "r2"));
    match settle(&mut models, &mut rx, "r2").await {
        RunnerStage::Failed { message, code } => {
            assert_eq!(code, "load_failed");
            assert!(message.contains("--kv-budget"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// Runs only where a CUDA driver is present (a GPU host): the weights and the KV page
/// pool go to device memory and are released on removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU: agent/gpu-check runs it"]
async fn on_cuda_a_runner_loads_into_device_memory_and_releases_it() {
    assert!(
        crate::memory::cuda::driver_present(),
        "no CUDA driver (libcuda) on this host"
    );
    let f = fixture();
    let (mut models, mut rx) = open_on(&f, Backend::Cuda);
    let a = artifact(&f.source);
    models.place(place(&f, a.clone(), "r1"));
    assert_eq!(settle(&mut models, &mut rx, "r1").await, RunnerStage::Ready);
    let pool = runner(&models.reports(&BTreeSet::new()).1, "r1")
        .pool
        .unwrap();
    assert_eq!(pool.weights_bytes, a.total_bytes());
    assert_eq!(pool.pages, 256);
    models.remove(&RemoveRunner {
        instance_id: "i-r1".into(),
        runner_id: "r1".into(),
    });
    assert!(models.ready_models().is_empty());
}
