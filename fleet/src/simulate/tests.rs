use super::*;

/// A small trace: two conversations, the second turn of each reusing the first.
fn tiny_trace() -> String {
    [
        r#"{"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [1, 2, 3]}"#,
        r#"{"timestamp": 10, "input_length": 1100, "output_length": 8, "hash_ids": [7, 8, 9]}"#,
        r#"{"timestamp": 2000, "input_length": 2000, "output_length": 12, "hash_ids": [1, 2, 3, 4]}"#,
        r#"{"timestamp": 2500, "input_length": 1600, "output_length": 5, "hash_ids": [7, 8, 9, 10]}"#,
    ]
    .join("\n")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn args(trace: PathBuf) -> SimulateArgs {
    SimulateArgs {
        trace: Some(trace),
        ..SimulateArgs::default()
    }
}

#[test]
fn prints_one_table_per_fleet_size_with_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let a = SimulateArgs {
        workers: "2,3".into(),
        ..args(write(&dir, "t.jsonl", &tiny_trace()))
    };
    let out = run(&a).unwrap();
    assert_eq!(out.matches("4 requests over").count(), 2, "{out}");
    assert!(out.contains(", 2 workers,") && out.contains(", 3 workers,"));
    for p in PolicyKind::ALL {
        assert!(out.contains(&format!("\n{:<13}", p.as_str())), "{p}: {out}");
    }
    assert!(out.contains("lower bound"));
    assert!(out.contains("den mean TTFT vs best other policy"));
}

#[test]
fn json_is_the_same_replay_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let a = SimulateArgs {
        json: true,
        policies: "den,dynamo".into(),
        explain: 1,
        ..args(write(&dir, "t.jsonl", &tiny_trace()))
    };
    let first = run(&a).unwrap();
    assert_eq!(first, run(&a).unwrap(), "same input, same bytes");
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let fleets = v.as_array().unwrap();
    assert_eq!(fleets.len(), 1);
    let policies = fleets[0]["report"]["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["den", "dynamo"]);
    assert_eq!(fleets[0]["report"]["workers"], 8);
    assert_eq!(fleets[0]["time_split"].as_array().unwrap().len(), 2);
}

#[test]
fn limit_and_no_object_store_reach_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let a = SimulateArgs {
        json: true,
        limit: Some(3),
        no_object_store: true,
        policies: "round-robin".into(),
        ..args(write(&dir, "t.jsonl", &tiny_trace()))
    };
    let v: serde_json::Value = serde_json::from_str(&run(&a).unwrap()).unwrap();
    let r = &v[0]["report"];
    assert_eq!(r["trace"]["requests"], 3);
    assert!(r["cost"]["object_store"].is_null());
    assert_eq!(r["policies"][0]["tiers"]["object_write_bytes"], 0);
}

#[test]
fn errors_are_one_line_and_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(&dir, "t.jsonl", &tiny_trace());
    let mut errors = Vec::new();
    let missing = dir.path().join("nope.jsonl");
    let e = run(&args(missing)).unwrap_err();
    assert!(
        e.starts_with("cannot read trace") && e.contains("nope.jsonl"),
        "{e}"
    );
    errors.push(e);

    let e = run(&SimulateArgs {
        policies: "den,magic".into(),
        ..args(good.clone())
    })
    .unwrap_err();
    assert!(e.contains("\"magic\"") && e.contains("llm-d"), "{e}");
    errors.push(e);

    let bad = write(
        &dir,
        "bad.jsonl",
        &format!(
            "{}\n{{\"timestamp\": 5}}\n",
            tiny_trace().lines().next().unwrap()
        ),
    );
    let e = run(&args(bad)).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
    errors.push(e);

    for w in ["0", "x", "", "4,-1"] {
        let e = run(&SimulateArgs {
            workers: w.into(),
            ..args(good.clone())
        })
        .unwrap_err();
        assert!(e.starts_with("--workers"), "{w}: {e}");
        errors.push(e);
    }
    let e = run(&SimulateArgs {
        den: "v99".into(),
        ..args(good.clone())
    })
    .unwrap_err();
    assert!(e.contains("v6"), "{e}");
    errors.push(e);
    let e = run(&SimulateArgs {
        limit: Some(0),
        ..args(good)
    })
    .unwrap_err();
    assert!(e.contains("--limit"), "{e}");
    errors.push(e);
    for e in &errors {
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn the_synthetic_profile_reaches_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let a = SimulateArgs {
        json: true,
        policies: "den".into(),
        profile: "synthetic".into(),
        den: "router".into(),
        ..args(write(&dir, "t.jsonl", &tiny_trace()))
    };
    let v: serde_json::Value = serde_json::from_str(&run(&a).unwrap()).unwrap();
    let cost = &v[0]["report"]["cost"];
    assert_eq!(cost["model"], "den synthetic engine");
    assert_eq!(cost["synthetic"]["prefill_ms_per_token"], 0.1);
    let e = run(&SimulateArgs {
        profile: "a100".into(),
        ..a
    })
    .unwrap_err();
    assert!(e.contains("--profile") && e.contains("synthetic"), "{e}");
}

/// `--max-waiting` is a setting of den-agent's router, not a study step: the table
/// still names the router, and it reaches the router. On one worker of 8 pages × 16
/// tokens, prompts ÷16, the second request (69 tokens) cannot fit beside the first
/// (94): it waits in the router by default, and `--max-waiting 0` refuses it instead
/// (the simulated client sends it again later).
#[test]
fn max_waiting_is_the_routers_setting() {
    let dir = tempfile::tempdir().unwrap();
    let committed = format!(
        "{}/profiles/smollm2-cpu-ssd16.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(committed).unwrap()).unwrap();
    profile["pages"] = 8.into();
    let profile = write(&dir, "small.json", &profile.to_string());
    let report = |max_waiting: Option<usize>| {
        let a = SimulateArgs {
            policies: "den".into(),
            workers: "1".into(),
            profile: profile.display().to_string(),
            max_waiting,
            length_scale: 16.0,
            ..args(write(&dir, "t.jsonl", &tiny_trace()))
        };
        let text = run(&a).unwrap();
        assert!(text.starts_with("den = den-agent's router"), "{text}");
        let v: serde_json::Value =
            serde_json::from_str(&run(&SimulateArgs { json: true, ..a }).unwrap()).unwrap();
        let p = &v[0]["report"]["policies"][0];
        // A zero count is left out of the JSON.
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        (n("waited_requests"), n("refused_requests"))
    };
    assert_eq!(report(None), (1, 0));
    assert_eq!(report(Some(0)), (0, 1));
}

/// The profiles BENCHMARKS.md's exact tables replay: they must keep parsing as the
/// saved-profile format grows, and reach the replay with their measured costs.
#[test]
fn the_committed_profiles_reach_the_replay() {
    for (name, length_scale) in [
        ("smollm2-cpu-ssd16.json", 16.0),
        ("smollm2-cpu-ssd32.json", 32.0),
    ] {
        let path = format!("{}/profiles/{name}", env!("CARGO_MANIFEST_DIR"));
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let a = SimulateArgs {
            json: true,
            policies: "den,dynamo".into(),
            profile: path.clone(),
            length_scale,
            ..args(write(&dir, "t.jsonl", &tiny_trace()))
        };
        let v: serde_json::Value = serde_json::from_str(&run(&a).unwrap()).unwrap();
        let cost = &v[0]["report"]["cost"]["synthetic"];
        let ms = |v: &serde_json::Value| v["prefill_ms_per_token"].as_f64().unwrap();
        assert!((ms(cost) - ms(&saved)).abs() < 1e-9, "{name}: {cost}");
        assert_eq!(
            cost["measured"]["step_us"].as_f64().map(|v| v.round()),
            saved["measured"]["step_us"].as_f64().map(|v| v.round()),
            "{name}"
        );
        let policies = v[0]["report"]["policies"].as_array().unwrap();
        assert_eq!(policies.len(), 2, "{name}");
        assert!(
            policies
                .iter()
                .all(|p| p["ttft_ms"]["mean"].as_f64().unwrap() > 0.0),
            "{name}"
        );
    }
}

#[test]
fn the_default_trace_is_used_only_when_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let there = write(&dir, "default.jsonl", &tiny_trace());
    assert_eq!(trace_path(None, &there).unwrap(), there);
    let given = dir.path().join("given.jsonl");
    assert_eq!(trace_path(Some(&given), &there).unwrap(), given);
    let e = trace_path(None, &dir.path().join("absent.jsonl")).unwrap_err();
    assert!(e.starts_with("--trace FILE is required"), "{e}");
}

#[test]
fn worker_lists_parse() {
    assert_eq!(parse_workers("8").unwrap(), vec![8]);
    assert_eq!(parse_workers(" 4, 8,16,8 ").unwrap(), vec![4, 8, 16]);
    assert!(parse_workers(",").is_err());
}
