//! Snapshots of every panel at 120×40 and 80×24 in the dark and high-contrast themes,
//! and of the overlays, from the fixture scenarios (Skulk 1.3.0 captures, simulated
//! decision records). Each snapshot holds the text and the styles of every cell.

use std::sync::LazyLock;

use den_protocol::time::Millis;

use crate::app::{Action, App, Panel};
use crate::fixtures::{self, SCENARIO_NOW};
use crate::model::Model;
use crate::testing::{draw, model_of, styled};
use crate::theme::Theme;

static SCENARIO: LazyLock<Model> =
    LazyLock::new(|| model_of(&fixtures::scenario().expect("fixture scenario")));

fn frame(app: &mut App, model: &Model, theme: &str, now: Millis, w: u16, h: u16) -> String {
    let theme = Theme::built_in(theme).expect("built-in theme");
    styled(&draw(app, model, &theme, now, w, h))
}

fn panel(panel: Panel, theme: &str, w: u16, h: u16) -> String {
    let mut app = App::focused(panel);
    frame(&mut app, &SCENARIO, theme, SCENARIO_NOW, w, h)
}

macro_rules! panel_snapshots {
    ($($name:ident => $panel:expr),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn dark_120x40() {
                    insta::assert_snapshot!(panel($panel, "dark", 120, 40));
                }

                #[test]
                fn dark_80x24() {
                    insta::assert_snapshot!(panel($panel, "dark", 80, 24));
                }

                #[test]
                fn high_contrast_120x40() {
                    insta::assert_snapshot!(panel($panel, "high-contrast", 120, 40));
                }

                #[test]
                fn high_contrast_80x24() {
                    insta::assert_snapshot!(panel($panel, "high-contrast", 80, 24));
                }
            }
        )*
    };
}

panel_snapshots! {
    nodes => Panel::Nodes,
    downloads => Panel::Downloads,
    instances => Panel::Instances,
    pages => Panel::Pages,
    routes => Panel::Routes,
    events => Panel::Events,
}

fn act(app: &mut App, model: &Model, actions: impl IntoIterator<Item = Action>) {
    for a in actions {
        app.prepare(model);
        app.update(a, model);
    }
}

fn typed(text: &str) -> Vec<Action> {
    text.chars().map(Action::Input).collect()
}

#[test]
fn help_overlay_for_routes() {
    let mut app = App::focused(Panel::Routes);
    act(&mut app, &SCENARIO, [Action::Help]);
    insta::assert_snapshot!(frame(&mut app, &SCENARIO, "dark", SCENARIO_NOW, 120, 40));
}

#[test]
fn palette_with_completion() {
    let mut app = App::focused(Panel::Instances);
    let mut actions = vec![Action::StartPalette];
    actions.extend(typed("delete "));
    actions.push(Action::Complete);
    act(&mut app, &SCENARIO, actions);
    insta::assert_snapshot!(frame(&mut app, &SCENARIO, "dark", SCENARIO_NOW, 120, 40));
}

#[test]
fn confirm_dialog_for_delete() {
    let mut app = App::focused(Panel::Instances);
    act(&mut app, &SCENARIO, [Action::RowCommand]);
    insta::assert_snapshot!(frame(&mut app, &SCENARIO, "dark", SCENARIO_NOW, 120, 40));
}

#[test]
fn read_only_refusal_in_the_footer() {
    let mut app = App::new(true, Some("session.den".into()));
    app.focus = Panel::Routes;
    act(&mut app, &SCENARIO, [Action::RowCommand]);
    insta::assert_snapshot!(frame(&mut app, &SCENARIO, "dark", SCENARIO_NOW, 80, 24));
}

#[test]
fn route_detail_shows_every_candidate_and_attempt() {
    let mut app = App::focused(Panel::Routes);
    let mut actions = vec![Action::StartFilter];
    actions.extend(typed("request-2"));
    actions.extend([Action::Submit, Action::Enter]);
    act(&mut app, &SCENARIO, actions);
    insta::assert_snapshot!(frame(&mut app, &SCENARIO, "dark", SCENARIO_NOW, 120, 40));
}

#[test]
fn instance_detail_lists_reasons_and_evidence() {
    let mut app = App::focused(Panel::Instances);
    act(&mut app, &SCENARIO, [Action::Bottom, Action::Enter]);
    insta::assert_snapshot!(frame(
        &mut app,
        &SCENARIO,
        "high-contrast",
        SCENARIO_NOW,
        120,
        40
    ));
}

#[test]
fn run_c_capture_instances_and_downloads() {
    let model = model_of(&fixtures::run_c_scenario().expect("runC"));
    let now = Millis(24_100);
    let mut out = String::new();
    for p in [Panel::Instances, Panel::Downloads, Panel::Nodes] {
        let mut app = App::focused(p);
        out.push_str(&crate::testing::text(&draw(
            &mut app,
            &model,
            &Theme::default(),
            now,
            120,
            16,
        )));
    }
    insta::assert_snapshot!(out);
}

#[test]
fn no_sources_explains_what_to_do() {
    let mut app = App::default();
    insta::assert_snapshot!(frame(
        &mut app,
        &Model::default(),
        "dark",
        Millis(0),
        80,
        24
    ));
}

#[test]
fn stale_rows_are_drawn_aged() {
    // gpu-c's last heartbeat is 20 s old: its row uses the stale style, gpu-a's does not.
    let theme = Theme::default();
    let mut app = App::focused(Panel::Pages);
    let buf = draw(&mut app, &SCENARIO, &theme, SCENARIO_NOW, 120, 40);
    let row_of = |name: &str| {
        (0..buf.area.height)
            .find(|y| {
                (0..buf.area.width)
                    .map(|x| buf.cell((x, *y)).map_or("", |c| c.symbol()))
                    .collect::<String>()
                    .contains(name)
            })
            .expect("row")
    };
    let fg_at = |y: u16, x: u16| buf.cell((x, y)).map(|c| c.fg);
    let stale = theme.stale().fg;
    // column 5 is inside the WORKER cell
    assert_eq!(fg_at(row_of("gpu-c"), 5), stale);
    assert_ne!(fg_at(row_of("gpu-b"), 5), stale);
    // the same frame drawn again is identical (no clock inside)
    let again = draw(&mut app, &SCENARIO, &theme, SCENARIO_NOW, 120, 40);
    assert_eq!(buf, again);
}

/// A frozen Skulk node (SIGSTOP) answers nothing, and each poll fails only at its
/// timeout: the header says "silent" once two answers are missed, instead of staying
/// green, and once the poll fails "down" counts from the last good answer, not from
/// den's verdict.
#[test]
fn a_frozen_source_is_silent_then_down_since_its_last_answer() {
    use den_protocol::evidence::{PollFailure, PollFailureKind};
    use den_protocol::session::{SessionEvent, SourceKind, Stamped};
    let state = fixtures::skulk_state("runC/state_idle.json").expect("state");
    let at = |ms: u64, event: SessionEvent| Stamped::new(Millis(ms), event);
    let mut events = vec![
        at(
            0,
            SessionEvent::SourceAdded {
                source: "skulk".into(),
                kind: SourceKind::Skulk,
                url: "http://127.0.0.1:52415".into(),
            },
        ),
        at(
            1_000,
            SessionEvent::SkulkState {
                source: "skulk".into(),
                state: Box::new(state),
                latency_ms: 3,
                received_unix_ms: None,
            },
        ),
    ];
    let header = |events: &[Stamped], now: u64| {
        let model = model_of(events);
        let mut app = App::default();
        let text = frame(&mut app, &model, "dark", Millis(now), 120, 20);
        text.lines().next().unwrap_or_default().to_owned()
    };
    assert!(
        header(&events, 3_000).contains("● skulk 3ms"),
        "{}",
        header(&events, 3_000)
    );
    let silent = header(&events, 7_000);
    assert!(silent.contains("◐ skulk silent 6s"), "{silent}");
    events.push(at(
        11_000,
        SessionEvent::PollFailed {
            source: "skulk".into(),
            endpoint: "/state".into(),
            failure: PollFailure {
                kind: PollFailureKind::Timeout,
                detail: "operation timed out".into(),
            },
            latency_ms: 10_000,
        },
    ));
    let down = header(&events, 12_000);
    assert!(down.contains("✗ skulk down 11s"), "{down}");
}

/// A request the router holds for KV pages: a `waiting` row (warn) in the Routes panel,
/// and its detail says so, with the candidate that lacked pages. The record is made by
/// den's router machine, from candidates den's candidate builder makes.
#[test]
fn a_waiting_route_and_its_detail() {
    use std::sync::Arc;

    use den_protocol::candidate_generation::candidates_for;
    use den_protocol::chunk_catalog::ChunkCatalog;
    use den_protocol::feed::FeedMessage;
    use den_protocol::request::GenerationRequest;
    use den_protocol::router::{Router, RouterInput};
    use den_protocol::session::{SessionEvent, Stamped};

    let mut full = fixtures::observation("gpu-b", fixtures::BRAVO, 4096, 99, 30);
    (full.free_pages, full.evictable_pages) = (10, 0);
    let request = GenerationRequest::new("held-1", fixtures::SIM_MODEL, (0..2000).collect(), 64)
        .expect("request");
    let candidates = candidates_for(&request, 64, [&full], &ChunkCatalog::default());
    let mut router = Router::default();
    let _ = router.handle(
        Millis(24_000),
        RouterInput::Hold {
            request: Arc::new(request),
            candidates,
            deadline: None,
        },
    );
    let record = router.record(&"held-1".into()).expect("record").clone();
    let mut events = fixtures::scenario().expect("fixture scenario");
    events.push(Stamped::new(
        Millis(24_000),
        SessionEvent::Feed {
            source: "router".into(),
            message: FeedMessage::Route {
                at: Millis(24_000),
                record: Box::new(record),
            },
        },
    ));
    let model = model_of(&events);
    let mut app = App::focused(Panel::Routes);
    let mut actions = vec![Action::StartFilter];
    actions.extend(typed("held-1"));
    actions.push(Action::Submit);
    act(&mut app, &model, actions);
    let row = frame(&mut app, &model, "dark", SCENARIO_NOW, 120, 40);
    assert!(row.contains("waiting for KV pages"), "{row}");
    act(&mut app, &model, [Action::Enter]);
    insta::assert_snapshot!(frame(&mut app, &model, "dark", SCENARIO_NOW, 120, 40));
}
