//! The command line: `den-agent router`, `den-agent worker`, `den-agent local`.
//!
//! Every option can be given as a flag, as an environment variable (named in `--help`)
//! or in the TOML config file (`--config`, `$DEN_CONFIG`, or `~/.config/den/agent.toml`)
//! under `[router]`, `[worker]` or `[local]`, with the flag's name in snake case.
//! Flags win over the environment, which wins over the file, which wins over the
//! built-in defaults. Unknown keys in the file are an error naming the key.

use std::net::SocketAddr;

use den_protocol::chunk::DEFAULT_CHUNK_SIZE;
use den_protocol::ids::{ModelFingerprint, NodeId, WorkerId};
use den_protocol::wire::DEFAULT_MAX_FRAME;

use crate::auth::Token;
use crate::engine::EngineCosts;
use crate::router::RouterOptions;
use crate::router::manage::ModelCatalog;
use crate::tiers::ObjectConfig;
use crate::worker::{DEFAULT_MODEL, MAX_IDLE_SPIN, WorkerOptions};

mod args;
mod file;

pub use args::{Cli, Command, LocalArgs, RouterArgs, WorkerArgs};
pub use file::{FileConfig, LocalFile, RouterFile, Size, WorkerFile};
use file::{dur, size};

/// Default router address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";

/// The router's address and options from flags/env (`a`) over the file (`f`).
pub fn router_options(
    a: &RouterArgs,
    f: &RouterFile,
) -> Result<(SocketAddr, RouterOptions), String> {
    let d = RouterOptions::default();
    let listen = a.listen.or(f.listen).unwrap_or_else(|| {
        DEFAULT_LISTEN
            .parse()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7070)))
    });
    let chunk_size = a.chunk_size.or(f.chunk_size).unwrap_or(DEFAULT_CHUNK_SIZE);
    if chunk_size == 0 {
        return Err("--chunk-size must be positive".into());
    }
    let max_frame = a
        .max_frame
        .or(size(&f.max_frame, "router.max_frame")?)
        .unwrap_or(DEFAULT_MAX_FRAME as u64);
    let opts = RouterOptions {
        name: NodeId::new(
            a.name
                .clone()
                .or(f.name.clone())
                .unwrap_or_else(|| d.name.to_string()),
        ),
        token: Token::choose(
            a.token.as_deref(),
            a.token_file.as_deref(),
            f.token.as_deref(),
            f.token_file.as_deref(),
        )?,
        api_keys: match a.api_keys_file.as_ref().or(f.api_keys_file.as_ref()) {
            Some(path) => Some(crate::api_keys::ApiKeys::from_file(path)?),
            None => None,
        },
        heartbeat_interval: a
            .heartbeat_interval
            .or(dur(&f.heartbeat_interval, "router.heartbeat_interval")?)
            .unwrap_or(d.heartbeat_interval),
        heartbeat_timeout: a
            .heartbeat_timeout
            .or(dur(&f.heartbeat_timeout, "router.heartbeat_timeout")?)
            .unwrap_or(d.heartbeat_timeout),
        offer_timeout: a
            .offer_timeout
            .or(dur(&f.offer_timeout, "router.offer_timeout")?)
            .unwrap_or(d.offer_timeout),
        request_deadline: a
            .request_deadline
            .or(dur(&f.request_deadline, "router.request_deadline")?)
            .unwrap_or(d.request_deadline),
        max_waiting: a.max_waiting.or(f.max_waiting).unwrap_or(d.max_waiting),
        retention: a
            .retention
            .or(dur(&f.retention, "router.retention")?)
            .unwrap_or(d.retention),
        chunk_size,
        max_frame: usize::try_from(max_frame).unwrap_or(usize::MAX),
        snapshot_interval: d.snapshot_interval,
        drain_timeout: a
            .drain_timeout
            .or(dur(&f.drain_timeout, "router.drain_timeout")?)
            .unwrap_or(d.drain_timeout),
        catalog: match a.catalog.as_ref().or(f.catalog.as_ref()) {
            Some(dir) => {
                std::sync::Arc::new(ModelCatalog::load_dir(dir).map_err(|e| e.to_string())?)
            }
            None => d.catalog,
        },
        catalog_cache: a
            .catalog_cache
            .clone()
            .or(f.catalog_cache.clone())
            .unwrap_or(d.catalog_cache),
        text_models: {
            let specs = if a.model_files.is_empty() {
                &f.model_files
            } else {
                &a.model_files
            };
            std::sync::Arc::new(text_models(specs)?)
        },
        limits: {
            let l = crate::listener::Limits::default();
            crate::listener::Limits {
                max_connections: a
                    .max_connections
                    .or(f.max_connections)
                    .unwrap_or(l.max_connections),
                max_per_peer: a
                    .max_connections_per_peer
                    .or(f.max_connections_per_peer)
                    .unwrap_or(l.max_per_peer),
                header_timeout: a
                    .header_timeout
                    .or(dur(&f.header_timeout, "router.header_timeout")?)
                    .unwrap_or(l.header_timeout),
                idle_timeout: a
                    .idle_timeout
                    .or(dur(&f.idle_timeout, "router.idle_timeout")?)
                    .unwrap_or(l.idle_timeout),
            }
        },
        tls: match (
            a.tls_cert.as_ref().or(f.tls_cert.as_ref()),
            a.tls_key.as_ref().or(f.tls_key.as_ref()),
        ) {
            (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key)?),
            (None, None) => None,
            (Some(_), None) => {
                return Err("--tls-cert needs --tls-key (the certificate's private key)".into());
            }
            (None, Some(_)) => {
                return Err("--tls-key needs --tls-cert (the certificate chain)".into());
            }
        },
    };
    let l = &opts.limits;
    if l.max_connections == 0
        || l.max_per_peer == 0
        || l.header_timeout.is_zero()
        || l.idle_timeout.is_zero()
    {
        return Err("--max-connections, --max-connections-per-peer, --header-timeout and --idle-timeout must be positive".into());
    }
    if opts.heartbeat_interval >= opts.heartbeat_timeout {
        return Err(format!(
            "--heartbeat-interval ({:?}) must be shorter than --heartbeat-timeout ({:?})",
            opts.heartbeat_interval, opts.heartbeat_timeout
        ));
    }
    Ok((listen, opts))
}

/// Opens each `[ID=]PATH` for its tokenizer and template.
fn text_models(specs: &[String]) -> Result<crate::ingress::TextModels, String> {
    let mut out = crate::ingress::TextModels::new();
    for spec in specs {
        let spec = spec.trim();
        if spec.is_empty() {
            continue;
        }
        // `ID=PATH`, unless what precedes `=` looks like a path itself.
        let (id, path) = match spec.split_once('=') {
            Some((id, path)) if !id.contains('/') && !id.is_empty() => (Some(id), path),
            _ => (None, spec),
        };
        let model = crate::model_file::ModelFile::open(std::path::Path::new(path), id)
            .map_err(|e| format!("--model-file {spec}: {e}"))?;
        out.add(&model);
    }
    Ok(out)
}

/// The worker's options from flags/env (`a`) over the file (`f`).
pub fn worker_options(a: &WorkerArgs, f: &WorkerFile) -> Result<WorkerOptions, String> {
    let router = a.router.clone().or(f.router.clone()).ok_or(
        "no router: give --router ws://ROUTER:7070 (or DEN_ROUTER, or router = \"…\" under [worker])",
    )?;
    let name = a.name.clone().or(f.name.clone()).unwrap_or_else(hostname);
    let data_dir = a
        .data_dir
        .clone()
        .or(f.data_dir.clone())
        .unwrap_or_else(|| {
            dirs::data_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join("den")
                .join(format!("worker-{name}"))
        });
    let mut o = WorkerOptions::new(router, &name, data_dir);
    o.token = Token::choose(
        a.token.as_deref(),
        a.token_file.as_deref(),
        f.token.as_deref(),
        f.token_file.as_deref(),
    )?;
    if let Some(node) = a.node.clone().or(f.node.clone()) {
        o.node = NodeId::new(node);
    }
    o.name = WorkerId::new(name);
    o.backend = a.backend.or(f.backend).unwrap_or_default();
    o.device = a.device.or(f.device).unwrap_or(0);
    o.pages = a.pages.or(f.pages).unwrap_or(o.pages);
    o.page_size = a.page_size.or(f.page_size).unwrap_or(o.page_size);
    o.kv_bytes_per_token = a
        .kv_bytes_per_token
        .or(size(&f.kv_bytes_per_token, "worker.kv_bytes_per_token")?)
        .unwrap_or(o.kv_bytes_per_token);
    let models = if a.models.is_empty() {
        &f.models
    } else {
        &a.models
    };
    o.models = if models.is_empty() {
        vec![ModelFingerprint::from(DEFAULT_MODEL)]
    } else {
        models
            .iter()
            .map(|m| ModelFingerprint::new(m.trim()))
            .collect()
    };
    o.model_file = a.model_file.clone().or(f.model_file.clone());
    o.model_threads = a.model_threads.or(f.model_threads);
    o.batch_tokens = a.batch_tokens.or(f.batch_tokens).unwrap_or(o.batch_tokens);
    if o.batch_tokens == 0 {
        return Err("--batch-tokens must be positive".into());
    }
    o.idle_spin = a
        .idle_spin
        .or(dur(&f.idle_spin, "worker.idle_spin")?)
        .unwrap_or(o.idle_spin);
    if o.idle_spin > MAX_IDLE_SPIN {
        return Err(format!(
            "--idle-spin {:?} is longer than {MAX_IDLE_SPIN:?}: an idle device thread would burn a core; use 0 to sleep at once",
            o.idle_spin
        ));
    }
    let d = EngineCosts::default();
    o.costs = EngineCosts::new(
        a.prefill_ms_per_token
            .or(f.prefill_ms_per_token)
            .unwrap_or(d.prefill_ms_per_token),
        a.decode_ms_per_token
            .or(f.decode_ms_per_token)
            .unwrap_or(d.decode_ms_per_token),
        a.first_token_ms
            .or(f.first_token_ms)
            .unwrap_or(d.first_token_ms),
    )
    .map_err(|e| e.to_string())?;
    o.ram_bytes = a
        .ram_bytes
        .or(size(&f.ram_bytes, "worker.ram_bytes")?)
        .unwrap_or(o.ram_bytes);
    o.ssd_bytes = a
        .ssd_bytes
        .or(size(&f.ssd_bytes, "worker.ssd_bytes")?)
        .unwrap_or(o.ssd_bytes);
    o.object_store = match a.object_store.clone().or(f.object_store.clone()) {
        Some(url) => Some(ObjectConfig::from_url_and_env(&url).map_err(|e| e.to_string())?),
        None => None,
    };
    o.chunk_size = a.chunk_size.or(f.chunk_size).unwrap_or(o.chunk_size);
    o.max_context = a.max_context.or(f.max_context);
    o.metrics_listen = a.metrics_listen.or(f.metrics_listen);
    o.fault_admin = a.fault_admin.or(f.fault_admin);
    o.drain_timeout = a
        .drain_timeout
        .or(dur(&f.drain_timeout, "worker.drain_timeout")?)
        .unwrap_or(o.drain_timeout);
    o.verify_restores = a.verify_restores.or(f.verify_restores).unwrap_or(true);
    o.kv_budget = a.kv_budget.or(size(&f.kv_budget, "worker.kv_budget")?);
    o.max_frame = usize::try_from(
        a.max_frame
            .or(size(&f.max_frame, "worker.max_frame")?)
            .unwrap_or(DEFAULT_MAX_FRAME as u64),
    )
    .unwrap_or(usize::MAX);
    Ok(o)
}

/// This host's name (for the default worker name).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".to_owned())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config;

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let file: FileConfig = config::parse(
            Path::new("agent.toml"),
            r#"
            [worker]
            router = "ws://file:1"
            pages = 64
            ram_bytes = "2MiB"
            models = ["a", "b"]
            drain_timeout = "2s"
            idle_spin = "50us"
            [router]
            chunk_size = 32
            "#,
        )
        .unwrap();
        let args = WorkerArgs {
            pages: Some(8),
            name: Some("w1".into()),
            ..WorkerArgs::default()
        };
        let o = worker_options(&args, &file.worker).unwrap();
        assert_eq!(o.router, "ws://file:1");
        assert_eq!(o.pages, 8, "flag over file");
        assert_eq!(o.ram_bytes, 2 << 20, "file over default");
        assert_eq!(o.page_size, 16, "default");
        assert_eq!(o.models.len(), 2);
        assert_eq!(o.drain_timeout, Duration::from_secs(2));
        assert_eq!(o.idle_spin, Duration::from_micros(50), "file over default");
        assert_eq!(o.node.as_str(), "w1", "node defaults to the name");
        let args = WorkerArgs {
            idle_spin: Some(Duration::ZERO),
            ..args
        };
        let o = worker_options(&args, &file.worker).unwrap();
        assert_eq!(o.idle_spin, Duration::ZERO, "flag over file");
        let (_, r) = router_options(&RouterArgs::default(), &file.router).unwrap();
        assert_eq!(r.chunk_size, 32);
    }

    #[test]
    fn config_errors_name_what_is_wrong() {
        let e = config::parse::<FileConfig>(Path::new("a.toml"), "[worker]\npagez = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pagez"), "{e}");
        let e = worker_options(&WorkerArgs::default(), &WorkerFile::default()).unwrap_err();
        assert!(e.contains("--router"), "{e}");
        let args = WorkerArgs {
            router: Some("ws://r:1".into()),
            prefill_ms_per_token: Some(-1.0),
            ..WorkerArgs::default()
        };
        assert!(
            worker_options(&args, &WorkerFile::default())
                .unwrap_err()
                .contains("prefill")
        );
        let args = WorkerArgs {
            router: Some("ws://r:1".into()),
            idle_spin: Some(Duration::from_millis(20)),
            ..WorkerArgs::default()
        };
        let e = worker_options(&args, &WorkerFile::default()).unwrap_err();
        assert!(e.contains("--idle-spin") && e.contains("10ms"), "{e}");
        let args = RouterArgs {
            heartbeat_interval: Some(Duration::from_secs(5)),
            ..RouterArgs::default()
        };
        assert!(
            router_options(&args, &RouterFile::default())
                .unwrap_err()
                .contains("shorter")
        );
    }

    #[test]
    fn help_explains_every_option() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        for sub in ["router", "worker", "local"] {
            let s = cmd.find_subcommand(sub).unwrap();
            for arg in s.get_arguments() {
                assert!(
                    arg.get_help().is_some() || arg.get_id() == "help",
                    "{sub} --{} has no help",
                    arg.get_id()
                );
            }
        }
    }
}
