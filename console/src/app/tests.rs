//! Key handling: palette completion and history, filter, sorting, confirmation of
//! mutating commands, read-only refusal.

use std::sync::LazyLock;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::*;
use crate::fixtures;
use crate::model::{Model, RouteRow};
use crate::testing::model_of;

static MODEL: LazyLock<Model> =
    LazyLock::new(|| model_of(&fixtures::scenario().expect("fixture scenario")));

fn run(app: &mut App, actions: impl IntoIterator<Item = Action>) -> Vec<Effect> {
    let mut effects = Vec::new();
    for a in actions {
        app.prepare(&MODEL);
        effects.extend(app.update(a, &MODEL));
    }
    app.prepare(&MODEL);
    effects
}

fn typed(text: &str) -> Vec<Action> {
    text.chars().map(Action::Input).collect()
}

fn visible_routes(app: &App) -> Vec<String> {
    let rows: &[RouteRow] = MODEL.routes();
    app.table(Panel::Routes)
        .order()
        .iter()
        .filter_map(|i| rows.get(*i))
        .map(|r| r.request.to_string())
        .collect()
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

#[test]
fn keys_mean_different_things_per_mode() {
    let q = key(KeyCode::Char('q'));
    assert_eq!(
        action_for(q, &Mode::Normal, Panel::Nodes),
        Some(Action::Quit)
    );
    assert_eq!(
        action_for(q, &Mode::Filter, Panel::Nodes),
        Some(Action::Input('q'))
    );
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    let palette = Mode::Palette(PaletteState::default());
    assert_eq!(
        action_for(ctrl_c, &palette, Panel::Nodes),
        Some(Action::Quit)
    );
    assert_eq!(
        action_for(key(KeyCode::Tab), &palette, Panel::Nodes),
        Some(Action::Complete)
    );
    assert_eq!(
        action_for(key(KeyCode::Tab), &Mode::Normal, Panel::Nodes),
        Some(Action::NextPanel)
    );
    assert_eq!(
        action_for(key(KeyCode::Char('3')), &Mode::Normal, Panel::Nodes),
        Some(Action::Focus(Panel::Instances))
    );
    let confirm = Mode::Confirm(Command::Quit);
    assert_eq!(
        action_for(key(KeyCode::Char('y')), &confirm, Panel::Nodes),
        Some(Action::Confirm)
    );
    // enter does not confirm: a mutating command takes a deliberate `y`
    assert_eq!(
        action_for(key(KeyCode::Enter), &confirm, Panel::Nodes),
        Some(Action::Deny)
    );
}

#[test]
fn filter_narrows_rows_and_esc_clears_it() {
    let mut app = App::focused(Panel::Routes);
    run(&mut app, []);
    assert_eq!(visible_routes(&app).len(), 5);
    let mut actions = vec![Action::StartFilter];
    actions.extend(typed("DECLINED"));
    run(&mut app, actions);
    assert_eq!(app.mode, Mode::Filter);
    assert_eq!(visible_routes(&app), ["request-2"]);
    run(&mut app, [Action::Backspace, Action::Submit]);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(app.table(Panel::Routes).filter, "DECLINE");
    let mut actions = vec![Action::StartFilter, Action::ClearInput];
    actions.extend(typed("gpu-a !running"));
    run(&mut app, actions);
    assert_eq!(
        visible_routes(&app),
        ["request-4", "request-2", "request-1"]
    );
    run(&mut app, [Action::Back]);
    assert_eq!(visible_routes(&app).len(), 5);
    assert!(app.table(Panel::Routes).filter.is_empty());
}

#[test]
fn filter_shows_whole_groups() {
    let mut app = App::focused(Panel::Instances);
    let mut actions = vec![Action::StartFilter];
    actions.extend(typed("no space left"));
    run(&mut app, actions);
    let rows = &MODEL.views().instances;
    let shown: Vec<&str> = app
        .table(Panel::Instances)
        .order()
        .iter()
        .filter_map(|i| rows.get(*i))
        .map(|r| r.instance())
        .collect();
    // the matching node row brings its instance and sibling along
    assert_eq!(shown.len(), 3);
    assert!(shown.iter().all(|i| i.starts_with("a2c16077")));
}

#[test]
fn sort_cycles_columns_and_reverses() {
    let mut app = App::focused(Panel::Routes);
    run(&mut app, []);
    // newest first by default
    assert_eq!(
        visible_routes(&app).first().map(String::as_str),
        Some("request-5")
    );
    let before = app.table(Panel::Routes).sort;
    run(&mut app, [Action::SortNext]);
    let after = app.table(Panel::Routes).sort;
    assert_ne!(before, after);
    // wraps to the first sortable column: REQUEST, ascending
    assert_eq!(
        visible_routes(&app),
        [
            "request-1",
            "request-2",
            "request-3",
            "request-4",
            "request-5"
        ]
    );
    run(&mut app, [Action::SortReverse]);
    assert_eq!(
        visible_routes(&app),
        [
            "request-5",
            "request-4",
            "request-3",
            "request-2",
            "request-1"
        ]
    );
    // selection follows its row across re-sorting
    run(&mut app, [Action::Down]);
    let selected = |app: &App| {
        app.table(Panel::Routes)
            .selected_row(MODEL.routes())
            .map(|r| r.request.to_string())
    };
    assert_eq!(selected(&app).as_deref(), Some("request-4"));
    run(&mut app, [Action::SortReverse]);
    assert_eq!(selected(&app).as_deref(), Some("request-4"));
}

#[test]
fn mutating_row_commands_wait_for_confirmation() {
    for (panel, expected) in [
        (
            Panel::Instances,
            Command::Delete {
                instance: "5838fcd2-a1f3-4dea-9074-158c5ed8c17c".into(),
            },
        ),
        (
            Panel::Routes,
            Command::Cancel {
                request: "request-5".into(),
            },
        ),
        (
            Panel::Pages,
            Command::Drain {
                worker: "gpu-a".into(),
            },
        ),
    ] {
        let mut app = App::focused(panel);
        let effects = run(&mut app, [Action::RowCommand]);
        assert!(
            effects.is_empty(),
            "{panel:?}: nothing runs before confirmation"
        );
        assert_eq!(app.mode, Mode::Confirm(expected.clone()));
        // any key but `y` declines
        let effects = run(&mut app, [Action::Deny]);
        assert!(effects.is_empty());
        assert_eq!(app.mode, Mode::Normal);
        let effects = run(&mut app, [Action::RowCommand, Action::Confirm]);
        assert_eq!(
            effects,
            [Effect::Execute {
                id: CommandSeq(1),
                command: expected
            }]
        );
    }
}

#[test]
fn a_finished_request_cannot_be_cancelled() {
    let mut app = App::focused(Panel::Routes);
    run(&mut app, [Action::Bottom]);
    let effects = run(&mut app, [Action::RowCommand]);
    assert!(effects.is_empty());
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        app.flash.as_ref().map(|f| f.text.as_str()),
        Some("that request already finished")
    );
}

#[test]
fn palette_completes_runs_through_confirmation_and_remembers() {
    let mut app = App::default();
    let mut actions = vec![Action::StartPalette];
    actions.extend(typed("drain "));
    actions.push(Action::Complete);
    run(&mut app, actions);
    match &app.mode {
        Mode::Palette(p) => {
            assert_eq!(p.input, "drain gpu-a");
            assert_eq!(p.candidates, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]);
        }
        other => panic!("{other:?}"),
    }
    run(&mut app, [Action::Complete, Action::Submit]);
    assert_eq!(
        app.mode,
        Mode::Confirm(Command::Drain {
            worker: "gpu-b".into()
        })
    );
    assert_eq!(app.history, ["drain gpu-b"]);
    run(
        &mut app,
        [Action::Deny, Action::StartPalette, Action::HistoryOlder],
    );
    match &app.mode {
        Mode::Palette(p) => assert_eq!(p.input, "drain gpu-b"),
        other => panic!("{other:?}"),
    }
    // navigation commands run at once
    run(&mut app, [Action::ClearInput]);
    run(&mut app, typed("routes"));
    run(&mut app, [Action::Submit]);
    assert_eq!(app.focus, Panel::Routes);
    assert_eq!(app.mode, Mode::Normal);
}

#[test]
fn palette_errors_are_one_line_and_keep_the_palette_open() {
    let mut app = App::default();
    let mut actions = vec![Action::StartPalette];
    actions.extend(typed("frobnicate now"));
    actions.push(Action::Submit);
    run(&mut app, actions);
    assert!(matches!(app.mode, Mode::Palette(_)));
    let flash = app.flash.clone().expect("flash");
    assert_eq!(flash.level, Level::Bad);
    assert!(
        flash.text.starts_with("unknown command `frobnicate`"),
        "{}",
        flash.text
    );
    assert!(!flash.text.contains('\n'));
}

#[test]
fn read_only_refuses_every_mutating_command_with_a_message() {
    let mut app = App::new(true, None);
    app.focus = Panel::Routes;
    let effects = run(&mut app, [Action::RowCommand]);
    assert_eq!(app.mode, Mode::Normal);
    let text = "read-only mode: `cancel request-5` refused (den was started with --read-only)";
    assert_eq!(effects, [Effect::Note(text.into())]);
    assert_eq!(app.flash.as_ref().map(|f| f.text.as_str()), Some(text));
    for line in ["delete x", "drain gpu-a", "place m"] {
        let mut actions = vec![Action::StartPalette];
        actions.extend(typed(line));
        actions.push(Action::Submit);
        let effects = run(&mut app, actions);
        assert!(
            matches!(effects.as_slice(), [Effect::Note(n)] if n.contains("refused")),
            "{line}"
        );
        assert_eq!(app.mode, Mode::Normal);
    }
    // reading is still fine
    run(&mut app, [Action::StartPalette]);
    run(&mut app, typed("nodes"));
    run(&mut app, [Action::Submit]);
    assert_eq!(app.focus, Panel::Nodes);
}

#[test]
fn enter_opens_the_detail_of_the_selected_row_and_esc_returns() {
    let mut app = App::focused(Panel::Routes);
    run(&mut app, [Action::Down, Action::Enter]);
    assert_eq!(
        app.mode,
        Mode::Detail {
            panel: Panel::Routes,
            key: "request-3".into(),
            scroll: 0
        }
    );
    run(&mut app, [Action::Down, Action::Down]);
    assert!(matches!(app.mode, Mode::Detail { scroll: 2, .. }));
    run(&mut app, [Action::Back]);
    assert_eq!(app.mode, Mode::Normal);
}

#[test]
fn quit_from_anywhere() {
    let mut app = App::default();
    run(&mut app, [Action::StartFilter]);
    assert_eq!(run(&mut app, [Action::Quit]), [Effect::Quit]);
    assert!(!app.running);
}

/// The flash that said a placement was sent is replaced by its outcome: a placement the
/// previews refuse does not keep saying "sent; progress in Events".
#[test]
fn the_sent_flash_turns_into_the_outcome() {
    use den_protocol::session::{CommandSeq, CommandStatus, SessionEvent, Stamped};
    let mut events = fixtures::scenario().expect("fixture scenario");
    let mut app = App::default();
    let mut model = model_of(&events);
    app.prepare(&model);
    let mut actions = vec![Action::StartPalette];
    actions.extend(typed("place mlx-community/nope alpha"));
    actions.push(Action::Submit);
    for a in actions {
        app.update(a, &model);
    }
    let effects = app.update(Action::Confirm, &model);
    let Some(Effect::Execute { id, command }) = effects.first() else {
        panic!("{effects:?}");
    };
    assert_eq!(*id, CommandSeq(1));
    let sent = app.flash.clone().expect("flash");
    assert!(sent.text.contains("sent"), "{}", sent.text);
    let at = den_protocol::time::Millis(60_000);
    events.push(Stamped::new(
        at,
        SessionEvent::Command {
            id: *id,
            text: command.to_string(),
        },
    ));
    events.push(Stamped::new(
        at,
        SessionEvent::CommandOutcome {
            id: *id,
            status: CommandStatus::Failed,
            detail: "placement failed: no preview places exactly the wanted nodes: model unknown"
                .into(),
        },
    ));
    model = model_of(&events);
    app.prepare(&model);
    let flash = app.flash.expect("flash");
    assert_eq!(flash.level, crate::model::Level::Bad);
    assert!(
        flash.text.contains("failed: placement failed: no preview"),
        "{}",
        flash.text
    );
    assert!(!flash.text.contains("sent"), "{}", flash.text);
}

/// Model names complete in the palette from the source's catalog (`GET /v1/models`,
/// runA's capture), before anything is running or downloading.
#[test]
fn place_completes_model_names_from_the_catalog() {
    use den_protocol::session::{SessionEvent, Stamped};
    let path = fixtures::skulk_fixture_dir().join("runA/v1_models.json");
    let text = std::fs::read_to_string(path).expect("capture");
    let list: den_protocol::skulk::api::ModelList = serde_json::from_str(&text).expect("list");
    let wanted = "mlx-community/Llama-3.1-Nemotron-Nano-4B-v1.1-4bit";
    assert!(list.data.iter().any(|m| m.id.as_str() == wanted));
    let mut events = fixtures::scenario().expect("fixture scenario");
    events.push(Stamped::new(
        den_protocol::time::Millis(30_000),
        SessionEvent::SkulkCatalog {
            source: "mgmt".into(),
            models: list.data.into_iter().map(|m| m.id).collect(),
        },
    ));
    let model = model_of(&events);
    let mut app = App::default();
    app.prepare(&model);
    let mut actions = vec![Action::StartPalette];
    actions.extend(typed("place mlx-community/Llama-3.1-Nemotron-Na"));
    actions.push(Action::Complete);
    for a in actions {
        app.update(a, &model);
    }
    match &app.mode {
        Mode::Palette(p) => assert_eq!(p.input, format!("place {wanted}")),
        other => panic!("{other:?}"),
    }
}
