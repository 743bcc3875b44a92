//! The example systemd units start on a fresh install: every file a unit needs
//! (`EnvironmentFile=` without `-`, `DEN_*_FILE`, `DEN_CONFIG`) is created by the install
//! steps in its header, every flag in `ExecStart` is one `den-agent` knows, and the token
//! never sits in the unit itself. (The units once set `DEN_CONFIG=/etc/den/agent.toml`,
//! which no step created: the first start exited 2 and restart-looped.)

use std::path::PathBuf;

use clap::CommandFactory;

fn unit(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Paths the unit needs to exist before its first start.
fn needed(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(f) = line.strip_prefix("EnvironmentFile=") {
            if !f.starts_with('-') {
                out.push(f.to_owned());
            }
        } else if let Some(v) = line.strip_prefix("Environment=")
            && let Some((k, path)) = v.split_once('=')
            && (k == "DEN_CONFIG" || k.ends_with("_FILE"))
        {
            out.push(path.to_owned());
        }
    }
    out
}

/// The install steps: the header's `#   sudo …` lines.
fn steps(text: &str) -> String {
    text.lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| l.starts_with("sudo") || l.starts_with("echo"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn exec_flags(text: &str) -> (String, Vec<String>) {
    let joined = text.replace("\\\n", " ");
    let exec = joined
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))
        .unwrap()
        .to_owned();
    let mut words = exec.split_whitespace().skip(1);
    let sub = words.next().unwrap().to_owned();
    let flags = words
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_start_matches("--")
                .split('=')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    (sub, flags)
}

#[test]
fn the_example_units_start_on_a_fresh_install() {
    let cli = den_agent::cli::Cli::command();
    for name in ["den-agent-router.service", "den-agent-worker.service"] {
        let text = unit(name);
        let install = steps(&text);
        for path in needed(&text) {
            assert!(
                install.contains(&path),
                "{name} needs {path}, which no install step creates:\n{install}"
            );
        }
        assert!(
            !text.contains("DEN_TOKEN=") && text.contains("DEN_TOKEN_FILE="),
            "{name}: the token belongs in a file, not in the unit"
        );
        assert!(
            text.lines().any(|l| l.trim() == "Type=notify"),
            "{name}: den-agent reports readiness (sd_notify); the unit should wait for it"
        );
        let (sub, flags) = exec_flags(&text);
        let command = cli
            .find_subcommand(&sub)
            .unwrap_or_else(|| panic!("{name}: no subcommand {sub}"));
        for f in flags {
            assert!(
                command
                    .get_arguments()
                    .any(|a| a.get_long() == Some(f.as_str()))
                    || cli
                        .get_arguments()
                        .any(|a| a.get_long() == Some(f.as_str())),
                "{name}: den-agent {sub} has no --{f}"
            );
        }
    }
}
