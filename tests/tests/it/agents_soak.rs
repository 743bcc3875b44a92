//! The soak benchmark's short form (BENCHMARKS.md has the 10-minute one): a real router
//! process, 200 simulated workers heartbeating at 1 Hz and answering every offer, and 100
//! requests per second for 15 s. Every request gets exactly one terminal answer, and it is
//! a completion: none lost, none answered twice. (Timings and memory are the benchmark's
//! to report, not this test's to judge.)

use std::process::Command;

#[test]
fn agents_soak_short_form_loses_and_duplicates_nothing() {
    let soak = den_tests::binary("den-agent-soak").expect("the soak binary");
    let out = Command::new(soak)
        .args([
            "--workers",
            "200",
            "--rate",
            "100",
            "--duration",
            "15s",
            "--every",
            "5s",
        ])
        .env_remove("DEN_CONFIG")
        .output()
        .expect("run den-agent-soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the soak lost, failed or duplicated requests:\n{stdout}\n{stderr}"
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:") && l.contains("lost"))
        .unwrap_or_else(|| panic!("no summary:\n{stdout}"));
    assert!(summary.contains(" 0 lost, 0 answered twice"), "{summary}");
    let sent: u64 = summary
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(sent >= 1000, "only {sent} requests were sent: {summary}");
    assert!(summary.contains(&format!("{sent} completed")), "{summary}");
}
