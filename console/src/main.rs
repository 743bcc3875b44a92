use clap::Parser;

/// den: the operator console for an LLM inference cluster.
#[derive(Debug, Parser)]
#[command(name = "den", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
