use clap::Parser;

/// den-agent: the headless router and worker roles of a den cluster.
#[derive(Debug, Parser)]
#[command(name = "den-agent", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
