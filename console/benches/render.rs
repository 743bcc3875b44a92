//! Render benchmark: one frame of each panel with 500 workers (nodes, page pools) and
//! 5 000 routes, drawn into an in-memory terminal. Target: < 5 ms per frame.
//!
//! `cargo bench -p den-console --bench render`
// A benchmark may unwrap, expect and panic: a broken set-up should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::LazyLock;

use ratatui::Terminal;
use ratatui::backend::TestBackend;

use den_console::app::{App, Panel};
use den_console::fixtures::{self, SCENARIO_NOW};
use den_console::model::Model;
use den_console::theme::Theme;
use den_protocol::feed::FeedMessage;
use den_protocol::session::{SessionEvent, Stamped};
use den_protocol::time::Millis;

fn main() {
    divan::main();
}

static MODEL: LazyLock<Model> = LazyLock::new(|| {
    let events = fixtures::synthetic(500, 5_000).expect("synthetic cluster");
    let mut model = Model::default();
    model.apply_all(&events);
    assert_eq!(model.routes().len(), 5_000);
    assert_eq!(model.views().pages.len(), 500);
    assert_eq!(model.views().nodes.len(), 500);
    model
});

const PANELS: [Panel; 6] = [
    Panel::Nodes,
    Panel::Downloads,
    Panel::Instances,
    Panel::Pages,
    Panel::Routes,
    Panel::Events,
];

/// Drawing one frame of a prepared panel (what the UI loop does per frame when only
/// time moved).
#[divan::bench(args = PANELS, sample_count = 200)]
fn frame_200x60(bencher: divan::Bencher, panel: Panel) {
    let model = &*MODEL;
    let theme = Theme::default();
    let mut app = App::focused(panel);
    app.prepare(model);
    let mut terminal = Terminal::new(TestBackend::new(200, 60)).expect("terminal");
    bencher.bench_local(|| {
        terminal
            .draw(|f| den_console::ui::draw(f, &app, model, &theme, SCENARIO_NOW))
            .expect("draw");
    });
}

/// A route update arrives and the Routes panel is drawn: apply, settle, re-sort the
/// 5 000 rows, draw (the worst case per frame while requests stream in).
#[divan::bench(sample_count = 100)]
fn route_update_then_frame(bencher: divan::Bencher) {
    let theme = Theme::default();
    let record = fixtures::sim_records().expect("records").remove(0);
    let mut model = MODEL.clone();
    let mut app = App::focused(Panel::Routes);
    app.prepare(&model);
    let mut terminal = Terminal::new(TestBackend::new(200, 60)).expect("terminal");
    let mut i = 0u64;
    bencher.bench_local(|| {
        i += 1;
        let mut r = record.clone();
        r.request = format!("req-{:06}", i % 5_000).into();
        model.apply(&Stamped::new(
            Millis(30_000 + i),
            SessionEvent::Feed {
                source: "router".into(),
                message: FeedMessage::Route {
                    at: Millis(30_000 + i),
                    record: Box::new(r),
                },
            },
        ));
        model.settle();
        app.prepare(&model);
        terminal
            .draw(|f| den_console::ui::draw(f, &app, &model, &theme, SCENARIO_NOW))
            .expect("draw");
    });
}

/// A heartbeat arrives and the Pages panel is drawn (rebuilds the 500 page and node rows).
#[divan::bench(sample_count = 100)]
fn heartbeat_then_frame(bencher: divan::Bencher) {
    let theme = Theme::default();
    let mut model = MODEL.clone();
    let mut app = App::focused(Panel::Pages);
    app.prepare(&model);
    let mut terminal = Terminal::new(TestBackend::new(200, 60)).expect("terminal");
    let mut i = 0u64;
    bencher.bench_local(|| {
        i += 1;
        let n = i % 500;
        let o = fixtures::observation(
            &format!("gpu-{n:04}"),
            &format!("node-{n:04}"),
            4096,
            (i % 100) as u32,
            100 + i,
        );
        model.apply(&Stamped::new(
            Millis(30_000 + i),
            SessionEvent::Feed {
                source: "router".into(),
                message: FeedMessage::Worker {
                    at: Millis(30_000 + i),
                    observation: Box::new(o),
                },
            },
        ));
        model.settle();
        app.prepare(&model);
        terminal
            .draw(|f| den_console::ui::draw(f, &app, &model, &theme, SCENARIO_NOW))
            .expect("draw");
    });
}
