//! A local cluster on loopback: one router and N workers as child processes of the
//! `den-agent` binary — the real thing, just on one machine. Used by `den-agent local`
//! and by `den-fleet validate` (`den demo` runs its agents in-process instead).
//!
//! Children print their bound addresses on stdout (`den-agent router listening on
//! http://…`, `den-agent worker metrics on http://…`); the launcher reads those lines,
//! so every port is picked by the kernel (no races over "free" ports). Children are
//! killed if the launcher is dropped; [`LocalCluster::stop`] shuts them down cleanly
//! (SIGTERM, which drains, then SIGKILL after a timeout).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// What to start.
#[derive(Debug, Clone)]
pub struct LocalClusterSpec {
    /// The `den-agent` binary (usually `std::env::current_exe()`).
    pub agent: PathBuf,
    pub workers: usize,
    pub token: Option<String>,
    /// Chunk size for the router and every worker.
    pub chunk_size: u32,
    /// Extra arguments for `den-agent router`.
    pub router_args: Vec<String>,
    /// Extra arguments for every `den-agent worker`.
    pub worker_args: Vec<String>,
    /// Workers' data directories go under here (`worker-1`, …).
    pub data_root: PathBuf,
    /// Keep each process's log here (`router.log`, `w-1.log`, …); discarded when `None`.
    pub log_dir: Option<PathBuf>,
    pub startup_timeout: Duration,
}

impl LocalClusterSpec {
    pub fn new(agent: PathBuf, workers: usize, data_root: PathBuf) -> Self {
        LocalClusterSpec {
            agent,
            workers,
            token: None,
            chunk_size: 64,
            router_args: Vec::new(),
            worker_args: Vec::new(),
            data_root,
            log_dir: None,
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalClusterError {
    #[error("cannot start {what} ({agent}): {source}")]
    Spawn {
        what: String,
        agent: String,
        source: std::io::Error,
    },
    #[error("{what} did not report its address within {secs} s{log}")]
    NoAddress {
        what: String,
        secs: u64,
        log: String,
    },
    #[error("only {ready} of {want} workers registered with the router within {secs} s")]
    NotReady {
        ready: usize,
        want: usize,
        secs: u64,
    },
}

/// A worker of a local cluster.
pub struct LocalWorker {
    pub name: String,
    /// `http://127.0.0.1:PORT` of its metrics endpoint.
    pub metrics_url: String,
    child: Child,
}

/// A running local cluster.
pub struct LocalCluster {
    /// `http://127.0.0.1:PORT` of the router.
    pub router_url: String,
    pub workers: Vec<LocalWorker>,
    token: Option<String>,
    router: Child,
}

impl LocalCluster {
    /// Start the router, then the workers, and wait until every worker heartbeats.
    pub async fn start(spec: &LocalClusterSpec) -> Result<LocalCluster, LocalClusterError> {
        if let Some(d) = &spec.log_dir {
            let _ = std::fs::create_dir_all(d);
        }
        let mut args: Vec<String> = vec![
            "router".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--chunk-size".into(),
            spec.chunk_size.to_string(),
        ];
        if let Some(t) = &spec.token {
            args.extend(["--token".into(), t.clone()]);
        }
        args.extend(spec.router_args.iter().cloned());
        let (mut router, mut lines) = spawn(spec, "router", &args)?;
        let router_url = match wait_line(
            &mut lines,
            "den-agent router listening on ",
            spec.startup_timeout,
        )
        .await
        {
            Some(url) => url,
            None => {
                let _ = router.start_kill();
                return Err(no_address(spec, "router"));
            }
        };
        drain(lines);
        let mut cluster = LocalCluster {
            router_url: router_url.clone(),
            workers: Vec::new(),
            token: spec.token.clone(),
            router,
        };
        for i in 1..=spec.workers {
            let name = format!("w-{i}");
            let mut args: Vec<String> = vec![
                "worker".into(),
                "--router".into(),
                router_url.clone(),
                "--name".into(),
                name.clone(),
                "--metrics-listen".into(),
                "127.0.0.1:0".into(),
                "--chunk-size".into(),
                spec.chunk_size.to_string(),
                "--data-dir".into(),
                spec.data_root.join(&name).display().to_string(),
            ];
            if let Some(t) = &spec.token {
                args.extend(["--token".into(), t.clone()]);
            }
            args.extend(spec.worker_args.iter().cloned());
            let (child, mut lines) = spawn(spec, &name, &args)?;
            let metrics = wait_line(
                &mut lines,
                "den-agent worker metrics on ",
                spec.startup_timeout,
            )
            .await;
            drain(lines);
            let Some(metrics_url) = metrics else {
                return Err(no_address(spec, &name));
            };
            cluster.workers.push(LocalWorker {
                name,
                metrics_url,
                child,
            });
        }
        cluster
            .wait_ready(spec.workers, spec.startup_timeout)
            .await?;
        Ok(cluster)
    }

    /// Wait until `n` workers heartbeat to the router.
    pub async fn wait_ready(&self, n: usize, timeout: Duration) -> Result<(), LocalClusterError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut ready = 0;
        while tokio::time::Instant::now() < deadline {
            let mut req = client.get(format!("{}/v1/workers", self.router_url));
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            if let Ok(resp) = req.send().await
                && let Ok(list) = resp.json::<Vec<serde_json::Value>>().await
            {
                ready = list.len();
                if ready >= n {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(LocalClusterError::NotReady {
            ready,
            want: n,
            secs: timeout.as_secs(),
        })
    }

    /// Stop every process cleanly: workers first (they drain), then the router.
    pub async fn stop(mut self) {
        for w in &mut self.workers {
            terminate(&mut w.child).await;
        }
        terminate(&mut self.router).await;
    }
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

fn spawn(
    spec: &LocalClusterSpec,
    what: &str,
    args: &[String],
) -> Result<(Child, Lines), LocalClusterError> {
    let stderr = match &spec.log_dir {
        Some(dir) => std::fs::File::create(dir.join(format!("{what}.log")))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null()),
        None => Stdio::null(),
    };
    let mut child = Command::new(&spec.agent)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| LocalClusterError::Spawn {
            what: what.to_owned(),
            agent: spec.agent.display().to_string(),
            source,
        })?;
    let Some(stdout) = child.stdout.take() else {
        return Err(LocalClusterError::Spawn {
            what: what.to_owned(),
            agent: spec.agent.display().to_string(),
            source: std::io::Error::other("no stdout pipe"),
        });
    };
    Ok((child, BufReader::new(stdout).lines()))
}

/// The rest of the line that starts with `prefix`, read within `timeout`.
async fn wait_line(lines: &mut Lines, prefix: &str, timeout: Duration) -> Option<String> {
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(rest.trim().to_owned());
            }
        }
        None
    };
    tokio::time::timeout(timeout, read).await.ok().flatten()
}

/// Keep reading a child's stdout so it never blocks on a full pipe.
fn drain(mut lines: Lines) {
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}

fn no_address(spec: &LocalClusterSpec, what: &str) -> LocalClusterError {
    LocalClusterError::NoAddress {
        what: what.to_owned(),
        secs: spec.startup_timeout.as_secs(),
        log: match &spec.log_dir {
            Some(d) => format!("; see {}", d.join(format!("{what}.log")).display()),
            None => "; rerun with --log-dir DIR to see why".into(),
        },
    }
}

/// SIGTERM, wait up to 15 s for the drain, then SIGKILL.
pub async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: sending a signal to a child process we started and still own.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
