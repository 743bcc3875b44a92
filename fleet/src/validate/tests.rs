use super::*;

fn tiny_trace(dir: &tempfile::TempDir) -> PathBuf {
    let text = [
        r#"{"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [1, 2, 3]}"#,
        r#"{"timestamp": 400, "input_length": 1100, "output_length": 8, "hash_ids": [7, 8, 9]}"#,
        r#"{"timestamp": 2000, "input_length": 2000, "output_length": 12, "hash_ids": [1, 2, 3, 4]}"#,
    ]
    .join("\n");
    let p = dir.path().join("t.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn the_plan_scales_the_slice_and_mirrors_the_flags_in_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let args = ValidateArgs {
        trace: Some(tiny_trace(&dir)),
        requests: Some(2),
        time_scale: 4.0,
        length_scale: 16.0,
        ..ValidateArgs::default()
    };
    let p = plan(&args).unwrap();
    assert_eq!(p.slice.requests.len(), 2);
    assert_eq!(p.slice.block_tokens, 32);
    assert_eq!(p.slice.requests[1].arrival_us, 100_000);
    assert_eq!(p.profile.chunk_tokens, 32);
    let c = &p.fleet.cost;
    assert_eq!(c.block_tokens, 32);
    assert_eq!(c.gpu_kv_blocks, 8192 * 16 / 32);
    let engine = c.synthetic.unwrap();
    assert_eq!(engine.prefill_ms_per_token, args.prefill_ms_per_token);
    assert_eq!(p.fleet.den, DenOptions::router());
    assert_eq!(p.fleet.heartbeats, Some(Heartbeats::den(100)));
    assert_eq!(p.fresh().heartbeats, None);
    let flags = worker_flags(&p.profile);
    let value = |k: &str| {
        let i = flags.iter().position(|f| f == k).unwrap();
        flags[i + 1].clone()
    };
    assert_eq!(value("--prefill-ms-per-token"), "0.1");
    assert_eq!(value("--pages"), "8192");
    assert_eq!(value("--kv-bytes-per-token"), "256");
    assert_eq!(value("--ssd-bytes"), "0");
    // The simulator and the cluster see the same prompts.
    let w = p.slice.workload();
    for (i, r) in w.requests.iter().enumerate() {
        assert_eq!(p.slice.tokens(i).len() as u32, r.input_tokens);
    }
}

#[test]
fn the_simulator_replays_requests_when_they_were_sent() {
    let dir = tempfile::tempdir().unwrap();
    let args = ValidateArgs {
        trace: Some(tiny_trace(&dir)),
        ..ValidateArgs::default()
    };
    let p = plan(&args).unwrap();
    let lag = |ms: f64| Measured {
        send_lag_ms: ms,
        ..Measured::default()
    };
    // Scheduled at 0, 100 and 500 ms; sent 2 ms, 0.5 ms and 0 ms late.
    let sent = as_sent(&p.slice, &[lag(2.0), lag(0.5), lag(0.0)]);
    let at: Vec<u64> = sent.requests.iter().map(|r| r.arrival_us).collect();
    assert_eq!(at, [2_000, 100_500, 500_000]);
    // Never out of order, and the prompts are untouched.
    let sent = as_sent(&p.slice, &[lag(150.0), lag(0.0), lag(0.0)]);
    let at: Vec<u64> = sent.requests.iter().map(|r| r.arrival_us).collect();
    assert_eq!(at, [150_000, 150_000, 500_000]);
    assert_eq!(sent.tokens(2), p.slice.tokens(2));
}

#[test]
fn following_the_router_runs_each_request_on_the_real_worker() {
    let dir = tempfile::tempdir().unwrap();
    let args = ValidateArgs {
        trace: Some(tiny_trace(&dir)),
        ..ValidateArgs::default()
    };
    let p = plan(&args).unwrap();
    let served = |w: &str, cached: u32| Measured {
        worker: Some(w.to_owned()),
        cached_tokens: Some(cached),
        ..Measured::default()
    };
    // The third request shares the first one's three blocks; the real worker
    // recomputed them (reused 0), on another worker than den would pick.
    let measured = [served("w-3", 0), served("w-1", 0), served("w-2", 0)];
    let mut follow = FollowRouter::new(&measured, p.slice.block_tokens, worker_index);
    let run = run_with(&p.slice.workload(), &p.fleet, &mut follow);
    assert_eq!(run.worker, [2, 0, 1]);
    assert_eq!(run.reused_tokens, [0, 0, 0]);
    // On the first request's worker, with its reuse, the simulator reuses the prefix.
    let reuse = 3 * p.slice.block_tokens;
    let measured = [served("w-3", 0), served("w-1", 0), served("w-3", reuse)];
    let mut follow = FollowRouter::new(&measured, p.slice.block_tokens, worker_index);
    let run = run_with(&p.slice.workload(), &p.fleet, &mut follow);
    assert_eq!(run.worker, [2, 0, 2]);
    assert_eq!(run.reused_tokens, [0, 0, reuse]);
}

#[test]
fn a_refused_request_counts_from_its_first_send_and_the_router_from_the_served_one() {
    let dir = tempfile::tempdir().unwrap();
    let args = ValidateArgs {
        trace: Some(tiny_trace(&dir)),
        ..ValidateArgs::default()
    };
    let p = plan(&args).unwrap();
    let w = p.slice.workload();
    let sim = Simulated {
        lagged: run_policy(&w, &p.fleet, PolicyKind::Den),
        fresh: run_policy(&w, &p.fresh(), PolicyKind::Den),
        followed: run_policy(&w, &p.fleet, PolicyKind::Den),
    };
    let served = |ttft: f64, predicted: f64, refusals: u32, sent: f64| Measured {
        client_ttft_ms: Some(ttft),
        router_predicted_ttft_ms: Some(predicted),
        worker: Some("w-1".into()),
        cached_tokens: Some(0),
        refusals,
        served_sent_ms: sent,
        ..Measured::default()
    };
    // The second was refused twice and served by its third submission, 2 s after the
    // first: its TTFT is 2.5 s from the first send, 0.5 s from the served one, which
    // the router predicted exactly.
    let measured = [
        served(100.0, 110.0, 0, 0.0),
        served(2_500.0, 500.0, 2, 2_000.0),
        served(200.0, 200.0, 0, 0.0),
    ];
    let report = ValidationReport::new(&args, &p, &sim, &measured, 1.0);
    let r = &report.rows[1];
    assert_eq!(r.measured_ttft_ms, Some(2_500.0));
    assert_eq!(r.served_ttft_ms, Some(500.0));
    assert_eq!(r.router_error, Some(0.0));
    assert_eq!(report.rows[0].router_error, Some(10.0 / 100.0));
    assert_eq!((report.summary.refused, report.summary.resends), (1, 2));
    assert_eq!(report.summary.measured_ttft_ms.max, 2_500.0);
    assert!(
        report
            .text(false)
            .contains("1 refused and sent again (2 resends)")
    );
}

#[test]
fn the_default_options_are_the_validation_profile() {
    let dir = tempfile::tempdir().unwrap();
    let args = ValidateArgs {
        trace: Some(tiny_trace(&dir)),
        ..ValidateArgs::default()
    };
    let p = plan(&args).unwrap();
    assert_eq!(p.profile, SyntheticProfile::validation(64));
    // clap's defaults are the same as `Default`.
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ValidateArgs,
    }
    let parsed = Cli::parse_from(["validate"]).args;
    assert_eq!(parsed, ValidateArgs::default());
}

#[test]
fn the_agent_is_the_one_given_else_the_one_beside_this_binary() {
    let given = Path::new("/opt/den/bin/den-agent");
    assert_eq!(agent_binary(Some(given)).unwrap(), given);
    // A test binary lives in deps/, where cargo puts no den-agent.
    let e = agent_binary(None).unwrap_err();
    assert!(e.contains("--agent PATH") && !e.contains('\n'), "{e}");
}

#[test]
fn bad_options_are_one_line_errors_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let good = ValidateArgs {
        trace: Some(tiny_trace(&dir)),
        ..ValidateArgs::default()
    };
    let cases = [
        (
            ValidateArgs {
                policy: "dynamo".into(),
                ..good.clone()
            },
            "--policy",
        ),
        (
            ValidateArgs {
                policy: "magic".into(),
                ..good.clone()
            },
            "--policy",
        ),
        (
            ValidateArgs {
                den: "v99".into(),
                ..good.clone()
            },
            "--den",
        ),
        (
            ValidateArgs {
                workers: 0,
                ..good.clone()
            },
            "--workers",
        ),
        (
            ValidateArgs {
                requests: Some(0),
                ..good.clone()
            },
            "--requests",
        ),
        (
            ValidateArgs {
                time_scale: 0.0,
                ..good.clone()
            },
            "time scale",
        ),
        (
            ValidateArgs {
                pages: Some(4),
                ..good.clone()
            },
            "--pages",
        ),
        (
            ValidateArgs {
                start: 100.0,
                ..good.clone()
            },
            "slice is empty",
        ),
        (
            ValidateArgs {
                trace: Some(dir.path().join("nope.jsonl")),
                ..good.clone()
            },
            "cannot read trace",
        ),
        (
            ValidateArgs {
                prefill_ms_per_token: -1.0,
                ..good.clone()
            },
            "--prefill-ms-per-token",
        ),
    ];
    for (args, want) in cases {
        let e = plan(&args).unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
