use super::*;

fn costs() -> StepCosts {
    // 10 µs a row, at least 1 ms a step, no attention or context terms.
    StepCosts::Batched {
        row_us: 10.0,
        weights_pass_us: 1_000.0,
        attention_us_per_position: 0.0,
        context_us_per_token: 0.0,
    }
}

fn pending(done: u32, input: u32) -> PendingPrefill {
    PendingPrefill {
        ready_in_ms: 0.0,
        done_tokens: done,
        input_tokens: input,
    }
}

#[test]
fn a_joiner_rides_in_the_last_partly_filled_step_and_lengthens_it() {
    // Budget 1000 rows: the pending 1500 tokens take two steps (10 ms, then 5 ms
    // for 500 rows); a 400-token joiner fits the second step, making it 9 ms.
    let plan = EnginePlan {
        pending: vec![pending(0, 1500)],
        ..EnginePlan::idle(1000, costs())
    };
    assert_eq!(plan.tail_step(), (500, 1));
    let alone = replay(&plan, None);
    assert_eq!(alone.finish_ms, vec![15.0]);
    let with = replay(&plan, Some(pending(0, 400)));
    assert_eq!(with.finish_ms, vec![19.0]);
    assert_eq!(with.joiner_finish_ms, Some(19.0));
}

#[test]
fn decodes_never_take_a_steps_last_prompt_rows() {
    assert_eq!(prompt_room(64, 8), 56);
    assert_eq!(prompt_room(64, 60), MIN_PROMPT_ROWS);
    assert_eq!(prompt_room(64, 1_000), MIN_PROMPT_ROWS);
    assert_eq!(prompt_room(8, 100), 8);
    assert_eq!(prompt_room(0, 0), 1);
    // The replay packs a step as the scheduler does: beside 60 decodes in a 64-row
    // budget, a 32-token prompt takes two steps of 16 rows, not eight of 4.
    let costs = StepCosts::Fitted {
        step_us: 1_000.0,
        row_us: 10.0,
        attention_us_per_position: 0.0,
        context_us_per_token: 0.0,
    };
    let plan = EnginePlan {
        decoding: 60,
        ..EnginePlan::idle(64, costs)
    };
    assert_eq!(plan.step_budget(), MIN_PROMPT_ROWS);
    let r = replay(&plan, Some(pending(0, 32)));
    let one = plan.step_ms(16, 0.0, 60, 0);
    assert_eq!(r.joiner_finish_ms, Some(2.0 * one));
}

#[test]
fn a_request_ahead_decodes_in_the_steps_after_its_prefill() {
    // 1 ms a step + 10 µs a row, budget 64 rows. A (64 tokens) fills step 1; with a
    // mean output of 4 tokens it then decodes for 3 steps, one row each, so the
    // 128-token joiner gets 63 rows a step: 63, 63, 2 over steps 2–4
    // (1.64 + 1.64 + 1.64 + 1.03 ms). Without the mean it gets 64, 64: 4.92 ms.
    let costs = StepCosts::Fitted {
        step_us: 1_000.0,
        row_us: 10.0,
        attention_us_per_position: 0.0,
        context_us_per_token: 0.0,
    };
    let mut plan = EnginePlan {
        pending: vec![pending(0, 64)],
        ..EnginePlan::idle(64, costs)
    };
    let without = replay(&plan, Some(pending(0, 128)));
    assert_eq!(without.joiner_finish_ms, Some(4.92));
    plan.mean_output_tokens = 4.0;
    let with = replay(&plan, Some(pending(0, 128)));
    let j = with.joiner_finish_ms.unwrap_or(0.0);
    assert!((j - 5.95).abs() < 1e-9, "{j}");
    // A's own finish is unchanged: its decodes come after its prefill.
    assert_eq!(with.finish_ms, vec![1.64]);
    // What comes from the network is bounded: a huge or broken mean is capped.
    for mean in [f64::NAN, f64::INFINITY, -3.0, 1e12] {
        plan.mean_output_tokens = mean;
        let r = replay(&plan, Some(pending(0, 128)));
        assert!(r.joiner_finish_ms.is_some_and(f64::is_finite), "{mean}");
    }
}

#[test]
fn a_request_not_ready_lets_later_ones_run_first() {
    let mut late = pending(0, 500);
    late.ready_in_ms = 100.0;
    let plan = EnginePlan {
        pending: vec![late],
        ..EnginePlan::idle(1000, costs())
    };
    let with = replay(&plan, Some(pending(0, 500)));
    // The joiner runs at once (5 ms); the late one at 100 ms.
    assert_eq!(with.joiner_finish_ms, Some(5.0));
    assert_eq!(with.finish_ms, vec![105.0]);
}

#[test]
fn pricing_sets_the_queue_to_what_precedes_its_own_compute_and_the_imposed_delay() {
    let plan = EnginePlan {
        pending: vec![pending(0, 1500)],
        ..EnginePlan::idle(1000, costs())
    };
    let without = replay(&plan, None).total_ms();
    let mut c = crate::candidate::tests::router_fixture("w", crate::candidate::Tier::None, 0);
    c.prefill_ms_per_token = 0.01;
    price(&plan, without, &mut c, 400, 399);
    // Finish 19 ms; own compute 399 × 0.01 = 3.99 ms.
    assert!((c.queue_ms - 15.01).abs() < 1e-9, "{}", c.queue_ms);
    assert_eq!(c.first_token_ms, 0.0);
    assert!((c.imposed_ms - 4.0).abs() < 1e-9, "{}", c.imposed_ms);
    let e = crate::candidate::estimate_shape(399, 16, &c);
    assert!((e.ttft_ms - 19.0).abs() < 1e-9, "{}", e.ttft_ms);
}

#[test]
fn a_hostile_plan_is_replayed_in_bounded_work() {
    let plan = EnginePlan {
        pending: vec![pending(0, u32::MAX); 1024],
        ..EnginePlan::idle(1, costs())
    };
    let r = replay(&plan, Some(pending(0, 10)));
    // One-row steps over 4 billion tokens each: the replay stops at its visit bound
    // and extrapolates, so the work stays bounded and the times finite and in order.
    assert!(r.visits <= MAX_VISITS + 1025, "{}", r.visits);
    let end = r.joiner_finish_ms.unwrap();
    assert!(end.is_finite(), "{end}");
    assert!(r.finish_ms.windows(2).all(|w| w[0] < w[1]));
    assert!(r.finish_ms.last().is_some_and(|f| *f < end));
}

#[test]
fn a_longer_queue_past_the_bound_still_prices_later() {
    // Past the visit bound the rest is extrapolated, never dropped: a worker with
    // more queued work must never look less loaded than one with less.
    let queue = |n: usize| EnginePlan {
        pending: vec![pending(0, 4_000); n],
        ..EnginePlan::idle(64, costs())
    };
    let mut last = 0.0;
    for n in [100, 400, 1_000, 3_000] {
        let r = replay(&queue(n), Some(pending(0, 100)));
        let end = r.joiner_finish_ms.unwrap();
        assert!(end > last, "{n} pending: {end} ms after {last} ms");
        last = end;
    }
    // 3 000 × 4 000 tokens in 64-row steps (1 ms each: the pass floor) is far past
    // the bound, and the extrapolation stays near the exact 187 500 steps + 2 for
    // the joiner (it prices the joiner's part step as a fraction).
    let r = replay(&queue(3_000), Some(pending(0, 100)));
    let exact = 187_502.0;
    let end = r.joiner_finish_ms.unwrap();
    assert!((end - exact).abs() / exact < 1e-3, "{end} vs {exact}");
}

#[test]
fn finished_requests_cost_no_visits() {
    // A long queue of finished requests ahead of one pending costs a few visits.
    let mut pending_list = vec![pending(10, 10); 10_000];
    pending_list.push(pending(0, 5_000));
    let plan = EnginePlan {
        pending: pending_list,
        ..EnginePlan::idle(1_000, costs())
    };
    let r = replay(&plan, None);
    assert_eq!(r.finish_ms.last().copied(), Some(50.0));
    assert!(r.visits < 20, "{}", r.visits);
}

#[test]
fn synthetic_steps_cost_their_rows_or_one_pass() {
    let s = StepCosts::Synthetic {
        prefill_us_per_token: 500.0,
        decode_us_per_step: 5_000.0,
        first_token_us: 8_000.0,
    };
    // Prompt rows only: per token, no pass floor.
    assert_eq!(s.step_us(4, 123.0, 0, 99), 2_000);
    // Eight decodes cost one pass, not eight.
    assert_eq!(s.step_us(0, 0.0, 8, 99), 5_000);
    assert_eq!(s.step_us_with_first(0, 0.0, 8, 99, true), 8_000);
    // Enough rows and the compute dominates, first token or not.
    assert_eq!(s.step_us_with_first(63, 0.0, 1, 0, true), 32_000);
    // A measured engine's first token is one more row.
    let b = StepCosts::Batched {
        row_us: 10.0,
        weights_pass_us: 100.0,
        attention_us_per_position: 0.0,
        context_us_per_token: 0.0,
    };
    assert_eq!(b.step_us_with_first(0, 0.0, 1, 0, true), 100);
}

#[test]
fn fitted_steps_add_their_rows_and_attention_to_the_fixed_cost() {
    let f = StepCosts::Fitted {
        step_us: 60_000.0,
        row_us: 2_500.0,
        attention_us_per_position: 8.0,
        context_us_per_token: 20.0,
    };
    // 64 prompt rows over 10 000 positions, two decodes reading 3 000 KV tokens.
    assert_eq!(
        f.step_us(64, 10_000.0, 2, 3_000),
        60_000 + 165_000 + 80_000 + 60_000
    );
    // Rows add to the pass (a CPU's compute does not hide behind it).
    assert!(f.step_us(16, 0.0, 0, 0) > f.step_us(1, 0.0, 0, 0));
    assert_eq!(f.step_us(0, 0.0, 0, 0), 0, "no rows, no step");
    assert_eq!(f.first_token_floor_us(), 0.0);
    assert!((f.first_token_step_ms() - 62.5).abs() < 1e-9);
    // On the wire as the other variants, by tag.
    let json = serde_json::to_string(&f).unwrap();
    assert!(json.contains("\"kind\":\"fitted\""), "{json}");
    assert_eq!(serde_json::from_str::<StepCosts>(&json).unwrap(), f);
}
