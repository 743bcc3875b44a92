//! Configuration: flags, then environment variables, then a TOML file
//! (`$XDG_CONFIG_HOME/den/console.toml`, or `--config PATH`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use den_protocol::session::{SourceId, SourceKind};

/// den: the operator console for an LLM inference cluster.
///
/// Without a subcommand, opens the console (a terminal UI) on the configured sources.
/// Sources come from flags, then DEN_ROUTER / DEN_SKULK / DEN_TOKEN / DEN_THEME, then the
/// config file.
#[derive(Debug, Parser)]
#[command(name = "den", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Sub>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Options every subcommand shares.
#[derive(Debug, Clone, Default, Args)]
pub struct CommonArgs {
    /// A den router: its WebSocket console feed and its management API
    /// (e.g. http://127.0.0.1:7000).
    #[arg(long, env = "DEN_ROUTER", value_name = "URL", global = true)]
    pub router: Option<String>,
    /// A Skulk-compatible management API, polled with bounded deadlines. Repeat it (or
    /// separate with commas) for the management and compute endpoints; `NAME=URL` names
    /// the source.
    #[arg(
        long,
        env = "DEN_SKULK",
        value_name = "[NAME=]URL",
        value_delimiter = ',',
        global = true
    )]
    pub skulk: Vec<String>,
    /// Bearer token for the configured sources (sent to their origins only).
    #[arg(
        long,
        env = "DEN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        global = true
    )]
    pub token: Option<String>,
    /// Read the token from this file's first line instead (keeps it out of argv and the
    /// shell history).
    #[arg(long, env = "DEN_TOKEN_FILE", value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
    /// Trust this PEM CA certificate, besides the system's roots, for https:// sources (a
    /// private CA, or a router's self-signed certificate).
    #[arg(long, env = "DEN_CA_CERT", value_name = "PATH", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Colour theme: dark (default), light, high-contrast, a name under
    /// $XDG_CONFIG_HOME/den/themes, or a path to a .toml file.
    #[arg(long, env = "DEN_THEME", value_name = "NAME", global = true)]
    pub theme: Option<String>,
    /// Refuse every command that changes the cluster (place, delete, cancel, drain).
    #[arg(long, env = "DEN_READ_ONLY", global = true)]
    pub read_only: bool,
    /// Record the session (semantic events, no secrets) to PATH.
    #[arg(long, value_name = "PATH", global = true, conflicts_with = "no_record")]
    pub record: Option<PathBuf>,
    /// Do not record, even if the config file says so.
    #[arg(long, global = true)]
    pub no_record: bool,
    /// Config file (default: $XDG_CONFIG_HOME/den/console.toml).
    #[arg(long, env = "DEN_CONFIG", value_name = "PATH", global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Print one snapshot of the cluster: nodes, downloads, instances with verdicts,
    /// pages, routes. Exit 0: every source answered; 1: none did; 2: partial.
    Status {
        /// JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// How long to wait for every source to answer once.
        #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
        timeout: f64,
    },
    /// Place MODEL on exactly the given nodes (preview, choose, fence, submit, reconcile).
    Place {
        model: String,
        /// A node the instance must run on (repeat for several).
        #[arg(long = "node", value_name = "ID")]
        nodes: Vec<String>,
        /// Requested per-sequence context (tokens): previews that cannot hold it are
        /// rejected, and the running instance's limit is checked against it.
        #[arg(long, value_name = "TOKENS", value_parser = crate::app::intent::parse_context_tokens)]
        context_tokens: Option<u64>,
        /// When the resource expires, an upper bound for every deadline: a duration from
        /// now (30m), @UNIX_SECONDS or an RFC 3339 time (2026-12-31T23:00:00Z).
        #[arg(long, value_name = "WHEN", value_parser = crate::app::intent::parse_expiry)]
        expires: Option<crate::app::intent::Expiry>,
        /// The node id the management API must answer as (GET /node_id); another answer
        /// stops the placement before anything is sent.
        #[arg(long, value_name = "ID", value_parser = crate::app::intent::parse_node_or_digest)]
        expect_management_node: Option<String>,
        /// The approved card digest: a preview or requirements with another fail.
        #[arg(long, value_name = "DIGEST", value_parser = crate::app::intent::parse_node_or_digest)]
        card_digest: Option<String>,
        /// How long to wait for download, runner and probe after submission (default 10m).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        wait: Option<std::time::Duration>,
        /// The compute node's own API (http://HOST:PORT): its /node_id must be one of the
        /// --node ids and its /state is polled beside the management API's.
        #[arg(long, value_name = "URL", value_parser = crate::app::intent::parse_compute_url)]
        compute: Option<String>,
        /// Do not ask before submitting.
        #[arg(long)]
        yes: bool,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a model instance (DELETE /instance/ID on the management API), then wait
    /// up to 10 s for /state to stop listing it. Exit 0 gone, 1 refused or unreachable,
    /// 2 acknowledged but still listed ("deletion requested, not yet confirmed").
    Delete {
        instance: String,
        /// Do not ask before deleting.
        #[arg(long)]
        yes: bool,
    },
    /// Reconcile every stored placement fence (uncertain or interrupted placements) with
    /// the management API it was submitted to, never re-posting: each ends placed,
    /// failed or still uncertain. Exit 0 when nothing is left uncertain or failed.
    Reconcile {
        /// One JSON object per fence on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a request at the den router (--router), or, without one, a generation at
    /// Skulk (--skulk) by its command id: POST /v1/cancel/COMMAND_ID.
    Cancel { request: String },
    /// Drain a den worker: no new offers, running work finishes.
    Drain { worker: String },
    /// Record the configured sources without a terminal (for servers, scripts and
    /// incident capture): every event the console would see, until DURATION passes or
    /// SIGINT/SIGTERM. Prints the file on exit.
    Record {
        /// The recording (`.zst` at the end compresses); default: a new file under
        /// $XDG_DATA_HOME/den/recordings.
        file: Option<PathBuf>,
        /// Stop after this long (e.g. 30s, 10m, 1h).
        #[arg(long, value_name = "TIME")]
        duration: Option<String>,
    },
    /// Replay a recording in the console's panels (space pause, ←/→ step, [/] ±10 s,
    /// g go to a time, +/- speed, f find, n/N next/previous match), or print it.
    Replay {
        /// A recording file (any of its segments).
        file: PathBuf,
        /// Print the incident timeline instead of opening the console.
        #[arg(long)]
        summary: bool,
        /// With --summary or --at: JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Print every panel as it was at TIME (e.g. 1m30s, 1:30, 90s).
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        /// Initial playback speed (0.25 to 64).
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
    },
    /// Start a router, three workers and a synthetic workload on 127.0.0.1 inside this
    /// process and open the console on them (`--headless`: print a summary instead).
    Demo {
        /// No terminal UI: run for --duration, then print TTFT and cache statistics.
        #[arg(long)]
        headless: bool,
        /// How long the workload runs (e.g. 10s, 2m); without it, until you quit.
        #[arg(long, value_parser = parse_duration)]
        duration: Option<std::time::Duration>,
        /// Number of workers (1 to 16).
        #[arg(long, default_value_t = 3, value_parser = parse_workers)]
        workers: usize,
        /// Serve this GGUF model for real [default: $DEN_MODEL_FILE, else SmolLM2-135M
        /// from tests/fetch-models' cache when it is there].
        #[arg(long, value_name = "PATH", conflicts_with = "synthetic")]
        model_file: Option<std::path::PathBuf>,
        /// Run the model-free synthetic engine even when a real model is present.
        #[arg(long)]
        synthetic: bool,
    },
}

/// `den demo --workers`: a cluster of 1 to 16 in-process workers (each runs its own
/// device thread on this one machine).
fn parse_workers(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=16) => Ok(n),
        _ => Err(format!("{s:?} is not a worker count: give 1 to 16")),
    }
}

/// Parse a human duration such as `500ms`, `10s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    den_agent::config::parse_duration(s)
}

/// The config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub router: Option<String>,
    #[serde(default)]
    pub skulk: Vec<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
    pub theme: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    pub record: Option<PathBuf>,
    pub poll_interval_ms: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub stale_after_ms: Option<u64>,
}

/// A configuration a user can get wrong. One line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: cannot read it: {detail}")]
    Unreadable { path: String, detail: String },
    #[error("config file {path}: {detail}")]
    Invalid { path: String, detail: String },
    #[error("{flag} {value:?}: expected http://HOST:PORT or https://HOST:PORT")]
    BadUrl { flag: &'static str, value: String },
    #[error("source name {0:?} is used twice: name sources with --skulk NAME=URL")]
    DuplicateName(String),
    #[error("{0}")]
    Token(String),
    #[error("--ca-cert: {0}")]
    CaCert(String),
}

/// One configured source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    pub id: SourceId,
    pub kind: SourceKind,
    /// Base URL as given (may carry a path prefix).
    pub url: String,
}

/// Everything the console and the subcommands run with.
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    pub sources: Vec<SourceSpec>,
    pub token: Option<String>,
    /// `--ca-cert`: trusted by every client of the process ([`den_agent::tls::trust_also`],
    /// called by `main` before the first connection).
    pub ca_cert: Option<PathBuf>,
    pub theme: String,
    pub read_only: bool,
    /// `--record PATH` or the config file's `record`.
    pub record: Option<PathBuf>,
    /// `--no-record`: record nothing (otherwise the console records to a new file under
    /// the data directory when no path is given).
    pub no_record: bool,
    pub poll_interval: Duration,
    pub request_timeout: Duration,
    pub stale_after_ms: u64,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("sources", &self.sources)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_cert", &self.ca_cert)
            .field("theme", &self.theme)
            .field("read_only", &self.read_only)
            .field("record", &self.record)
            .field("no_record", &self.no_record)
            .finish()
    }
}

/// The default config file path.
pub fn default_config_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("den").join("console.toml"))
}

/// Read the config file: an explicit path must exist; the default path may not.
pub fn read_file(explicit: Option<&Path>) -> Result<FileConfig, ConfigError> {
    let (path, required) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => match default_config_path() {
            Some(p) => (p, false),
            None => return Ok(FileConfig::default()),
        },
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(FileConfig::default());
        }
        Err(e) => {
            return Err(ConfigError::Unreadable {
                path: path.display().to_string(),
                detail: e.to_string(),
            });
        }
    };
    parse_file(&text, &path.display().to_string())
}

pub fn parse_file(text: &str, path: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Invalid {
        path: path.to_owned(),
        detail: den_protocol::text::one_line(e.message()),
    })
}

/// Merge flags/env (already merged by clap) with the file.
pub fn resolve(args: &CommonArgs, file: FileConfig) -> Result<Settings, ConfigError> {
    let router = args.router.clone().or(file.router);
    let skulk = if args.skulk.is_empty() {
        file.skulk
    } else {
        args.skulk.clone()
    };
    let mut sources = Vec::new();
    if let Some(url) = router.filter(|u| !u.trim().is_empty()) {
        check_url("--router", &url)?;
        sources.push(SourceSpec {
            id: SourceId::new("router"),
            kind: SourceKind::DenRouter,
            url,
        });
    }
    let skulk: Vec<&String> = skulk.iter().filter(|s| !s.trim().is_empty()).collect();
    for (i, entry) in skulk.iter().enumerate() {
        let (name, url) = match entry.split_once('=') {
            Some((name, url)) if !name.contains("://") && !name.is_empty() => {
                (name.to_owned(), url.to_owned())
            }
            _ if skulk.len() == 1 => ("skulk".to_owned(), (*entry).clone()),
            _ => (format!("skulk-{}", i + 1), (*entry).clone()),
        };
        check_url("--skulk", &url)?;
        if sources.iter().any(|s: &SourceSpec| s.id.as_str() == name) {
            return Err(ConfigError::DuplicateName(name));
        }
        sources.push(SourceSpec {
            id: SourceId::new(name),
            kind: SourceKind::Skulk,
            url,
        });
    }
    let record = if args.no_record {
        None
    } else {
        args.record.clone().or(file.record)
    };
    Ok(Settings {
        sources,
        token: den_agent::auth::Token::choose(
            args.token.as_deref(),
            args.token_file.as_deref(),
            file.token.as_deref(),
            file.token_file.as_deref(),
        )
        .map_err(ConfigError::Token)?
        .map(|t| t.expose().to_owned()),
        ca_cert: args.ca_cert.clone().or(file.ca_cert),
        theme: args
            .theme
            .clone()
            .or(file.theme)
            .unwrap_or_else(|| "dark".to_owned()),
        read_only: args.read_only || file.read_only,
        record,
        no_record: args.no_record,
        poll_interval: Duration::from_millis(file.poll_interval_ms.unwrap_or(2_000).max(100)),
        request_timeout: Duration::from_millis(file.request_timeout_ms.unwrap_or(5_000).max(100)),
        stale_after_ms: file.stale_after_ms.unwrap_or(10_000),
    })
}

fn check_url(flag: &'static str, url: &str) -> Result<(), ConfigError> {
    let ok = reqwest::Url::parse(url)
        .ok()
        .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadUrl {
            flag,
            value: url.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> CommonArgs {
        let mut argv = vec!["den"];
        argv.extend_from_slice(list);
        Cli::try_parse_from(argv).expect("parse").common
    }

    #[test]
    fn flags_win_over_the_file_and_sources_are_named() {
        let file = parse_file(
            "router = \"http://file:1\"\nskulk = [\"http://f:2\"]\ntheme = \"light\"\nread_only = true\n",
            "c.toml",
        )
        .unwrap();
        let s = resolve(
            &args(&["--skulk", "mgmt=http://a:1,http://b:2"]),
            file.clone(),
        )
        .unwrap();
        let ids: Vec<&str> = s.sources.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["router", "mgmt", "skulk-2"]);
        assert_eq!(s.sources[0].url, "http://file:1");
        assert_eq!(s.theme, "light");
        assert!(s.read_only);
        let s = resolve(&args(&["--theme", "high-contrast"]), file).unwrap();
        assert_eq!(s.theme, "high-contrast");
        assert_eq!(s.sources[1].id.as_str(), "skulk");
    }

    #[test]
    fn bad_input_is_one_line_naming_what_is_wrong() {
        let err = resolve(&args(&["--skulk", "ftp://x"]), FileConfig::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--skulk \"ftp://x\": expected http://HOST:PORT or https://HOST:PORT"
        );
        let err = parse_file("routr = \"x\"", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("config file c.toml: unknown field `routr`"),
            "{err}"
        );
        assert!(!err.contains('\n'));
        let err = resolve(
            &args(&["--skulk", "a=http://x:1,a=http://y:1"]),
            FileConfig::default(),
        );
        assert!(matches!(err, Err(ConfigError::DuplicateName(_))));
        let err = read_file(Some(Path::new("/nonexistent/den.toml"))).unwrap_err();
        assert!(matches!(err, ConfigError::Unreadable { .. }));
    }

    #[test]
    fn no_record_overrides_the_file_and_tokens_stay_out_of_debug() {
        let file = FileConfig {
            record: Some("x.den".into()),
            token: Some("secret".into()),
            ..FileConfig::default()
        };
        let s = resolve(&args(&["--no-record"]), file).unwrap();
        assert_eq!(s.record, None);
        assert!(s.no_record);
        assert!(!format!("{s:?}").contains("secret"));
        assert!(Cli::try_parse_from(["den", "--record", "a", "--no-record"]).is_err());
    }

    #[test]
    fn demo_workers_are_one_to_sixteen() {
        for (n, ok) in [
            ("0", false),
            ("1", true),
            ("16", true),
            ("17", false),
            ("x", false),
        ] {
            let parsed = Cli::try_parse_from(["den", "demo", "--workers", n]);
            assert_eq!(parsed.is_ok(), ok, "--workers {n}");
        }
        let err = Cli::try_parse_from(["den", "demo", "--workers", "0"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("give 1 to 16"), "{err}");
    }

    #[test]
    fn subcommands_parse() {
        let cli = Cli::try_parse_from(["den", "place", "m", "--node", "a", "--node", "b", "--yes"])
            .unwrap();
        match cli.command {
            Some(Sub::Place {
                model,
                nodes,
                yes,
                json,
                context_tokens: None,
                expires: None,
                ..
            }) => {
                assert_eq!(
                    (model.as_str(), nodes.len(), yes, json),
                    ("m", 2, true, false)
                );
            }
            other => panic!("{other:?}"),
        }
        let cli = Cli::try_parse_from([
            "den",
            "place",
            "m",
            "--context-tokens",
            "8192",
            "--expires",
            "@1767225600",
            "--expect-management-node",
            "mgmt-1",
            "--card-digest",
            "sha256:00ff",
            "--wait",
            "90s",
        ])
        .unwrap();
        match cli.command {
            Some(Sub::Place {
                context_tokens,
                expires,
                expect_management_node,
                card_digest,
                wait,
                ..
            }) => {
                assert_eq!(context_tokens, Some(8192));
                assert_eq!(
                    expires,
                    Some(crate::app::intent::Expiry::AtUnixMs(1_767_225_600_000))
                );
                assert_eq!(expect_management_node.as_deref(), Some("mgmt-1"));
                assert_eq!(card_digest.as_deref(), Some("sha256:00ff"));
                assert_eq!(wait, Some(std::time::Duration::from_secs(90)));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            ["den", "place", "m", "--context-tokens", "0"],
            ["den", "place", "m", "--expires", "whenever"],
            ["den", "place", "m", "--card-digest", "a b"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
        let cli =
            Cli::try_parse_from(["den", "status", "--json", "--router", "http://r:1"]).unwrap();
        assert!(matches!(cli.command, Some(Sub::Status { json: true, .. })));
        assert_eq!(cli.common.router.as_deref(), Some("http://r:1"));
    }
}
