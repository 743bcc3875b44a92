//! The command line: `den-fleet simulate` and `den-fleet validate`.

use clap::{Parser, Subcommand};

use den_agent::logging::LogFormat;

use crate::simulate::SimulateArgs;
use crate::validate::ValidateArgs;

/// den-fleet: den's routing policy against the baselines on a production trace.
///
/// `den-fleet simulate` compares the policies on the fleet simulator; `den-fleet validate`
/// replays a slice of the trace on real `den-agent` processes and on the simulator, and
/// reports how far the simulator is from the measurement.
#[derive(Debug, Parser)]
#[command(name = "den-fleet", version, about, long_about)]
pub struct Cli {
    /// Log format: human-readable text or JSON lines.
    #[arg(
        long,
        global = true,
        env = "DEN_LOG_FORMAT",
        value_enum,
        value_name = "FORMAT"
    )]
    pub log_format: Option<LogFormat>,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `den_agent=debug` (default: info).
    #[arg(long, global = true, env = "DEN_LOG", value_name = "FILTER")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay a trace in the Mooncake format through den's routing policy and the
    /// baselines (round-robin, least-loaded, Dynamo, SGLang, llm-d) on the fleet
    /// simulator, and print one comparison table.
    Simulate(SimulateArgs),
    /// Replay a scaled slice of a trace on a real router and workers (child processes of
    /// `den-agent`) and on the fleet simulator with the same synthetic-engine costs, and
    /// report predicted vs measured TTFT per request.
    Validate(ValidateArgs),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_explains_every_option() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        for sub in ["simulate", "validate"] {
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
