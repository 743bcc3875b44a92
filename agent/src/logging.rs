//! Structured logs through `tracing`: human-readable text by default, JSON lines with
//! `--log-format json` for log shippers. `RUST_LOG` (or `--log`) filters.

use std::io::IsTerminal;
use std::str::FromStr;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?}: use text or json")),
        }
    }
}

/// Install the global subscriber. Logs go to stderr so stdout stays free for command
/// output (`den-fleet simulate --json`). A second call is a no-op.
pub fn init(format: LogFormat, filter: Option<&str>) {
    let _ = FORMAT.set(format);
    let filter = filter
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Whether logs are JSON lines for a shipper (then a fatal error belongs in them as an
/// event; in text mode the process prints it as one plain line instead of twice).
pub fn is_json() -> bool {
    FORMAT.get() == Some(&LogFormat::Json)
}
