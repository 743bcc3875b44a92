//! Fidelity: the console driven by live sources on loopback (a den router stand-in with
//! its feed and management API, and the Skulk fixture server) while it records; frames
//! captured at several moments; the recording replayed to the same moments draws the
//! same frames, cell for cell and style for style.

use std::path::Path;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use tokio::sync::mpsc;

use den_console::app::{App, Panel};
use den_console::config::{Settings, SourceSpec};
use den_console::fixtures::{self, ALPHA, BRAVO};
use den_console::model::Model;
use den_console::replay::Replayer;
use den_console::sources::{self, PollConfig};
use den_console::theme::Theme;
use den_console::tui::{Console, start_recorder};
use den_protocol::feed::{FEED_VERSION, FeedMessage};
use den_protocol::session::SourceKind;
use den_protocol::time::Millis;
use den_tests::{FixtureServer, RouterStub, script_path};

const WIDTH: u16 = 120;
const HEIGHT: u16 = 36;

fn settings(router: &str, skulk: &str, record: &Path) -> Settings {
    Settings {
        sources: vec![
            SourceSpec {
                id: "router".into(),
                kind: SourceKind::DenRouter,
                url: router.to_owned(),
            },
            SourceSpec {
                id: "mgmt".into(),
                kind: SourceKind::Skulk,
                url: skulk.to_owned(),
            },
        ],
        token: None,
        ca_cert: None,
        theme: "dark".into(),
        read_only: false,
        record: Some(record.to_path_buf()),
        no_record: false,
        poll_interval: Duration::from_millis(150),
        request_timeout: Duration::from_secs(2),
        stale_after_ms: 10_000,
    }
}

fn text(buf: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            if let Some(c) = buf.cell((x, y)) {
                out.push_str(c.symbol());
            }
        }
        out.push('\n');
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_frames_equal_the_frames_the_operator_saw() {
    let dir = den_tests::temp_dir().expect("temp dir");
    let file = dir.path().join("live.jsonl");
    let skulk = FixtureServer::start_with(
        Path::new(env!("CARGO_BIN_EXE_skulk-fixture-server")),
        &script_path("placement_accepted_ready.json"),
        &[],
    )
    .expect("fixture server");
    let records = fixtures::sim_records().expect("records");
    let state = std::fs::read_to_string(den_tests::skulk_fixture(
        "derived/state_two_nodes_running.json",
    ))
    .expect("state");
    let hello = FeedMessage::Hello {
        feed_version: FEED_VERSION,
        router: "den-router-1".into(),
        started_at_unix_ms: 1_750_000_000_000,
    };
    let snapshot = FeedMessage::Snapshot {
        at: Millis(10),
        workers: vec![
            fixtures::observation("gpu-a", ALPHA, 4096, 30, 1),
            fixtures::observation("gpu-b", BRAVO, 4096, 60, 1),
        ],
        routes: records.iter().take(2).cloned().collect(),
    };
    let router = RouterStub::start(ALPHA, state, vec![hello, snapshot])
        .await
        .expect("router stub");

    let settings = settings(&router.url(), &skulk.url(), &file);
    let recorder = start_recorder(&settings).expect("recorder");
    let label = recorder.as_ref().map(|r| r.path().display().to_string());
    let mut console = Console::new(
        App::new(false, label),
        Model::new(den_console::tui::model_config(&settings)),
        Theme::default(),
        recorder,
    );
    let (tx, mut rx) = mpsc::channel(4096);
    // As the interactive console polls (catalog included).
    let poll = PollConfig {
        interval: settings.poll_interval,
        timeout: settings.request_timeout,
        catalog: true,
    };
    let tasks = sources::spawn_all(&settings.sources, None, poll, &tx).expect("sources");
    let mut terminal = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).expect("terminal");

    // The test's clock: 100 ms of console time per step, whatever the machine's speed.
    let mut now = Millis(0);
    for spec in &settings.sources {
        console.apply(now, sources::added(spec));
    }
    let mut captures: Vec<(Millis, App, Buffer)> = Vec::new();
    let mut seq = 2;
    for step in 0..70u64 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        now = now.saturating_add(100);
        // What the router does meanwhile.
        if step % 3 == 0 {
            for (w, node, base) in [("gpu-a", ALPHA, 30), ("gpu-b", BRAVO, 60)] {
                if w == "gpu-a" && step > 45 {
                    continue;
                }
                let used = base + (step as u32 * 7) % 30;
                router.push(&FeedMessage::Worker {
                    at: Millis(step * 100),
                    observation: Box::new(fixtures::observation(w, node, 4096, used, seq)),
                });
            }
            seq += 1;
        }
        if let Some(record) = records.get(2 + (step / 8) as usize)
            && step % 8 == 5
        {
            router.push(&FeedMessage::Route {
                at: Millis(step * 100),
                record: Box::new(record.clone()),
            });
        }
        if step == 46 {
            router.push(&FeedMessage::WorkerGone {
                at: Millis(step * 100),
                worker: "gpu-a".into(),
                reason: "disconnected".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
        while let Ok(event) = rx.try_recv() {
            console.apply(now, event);
        }
        // The operator looks around: another panel, a row further down.
        if step % 7 == 6 {
            let panel = Panel::ALL[(step as usize / 7) % Panel::ALL.len()];
            console.key(
                now,
                KeyEvent::new(
                    KeyCode::Char(char::from(b'1' + panel.index() as u8)),
                    KeyModifiers::NONE,
                ),
            );
            console.key(now, KeyEvent::new(KeyCode::Char('j'), KeyModifiers::NONE));
            let at = console.draw(&mut terminal, now).expect("draw");
            captures.push((at, console.app.clone(), terminal.backend().buffer().clone()));
        }
    }
    for task in tasks {
        task.abort();
    }
    let closed = console
        .close_recording(now)
        .expect("recording")
        .expect("closed");
    assert!(closed.events > 100, "{closed:?}");
    assert_eq!(closed.dropped, 0);
    assert!(captures.len() >= 9);
    // The live session saw both sources, the feed and the gone worker.
    let live_text = text(&captures.last().expect("a frame").2);
    if std::env::var_os("SHOW_FRAMES").is_some() {
        for (at, _, b) in &captures {
            eprintln!("--- {at} ---\n{}", text(b));
        }
    }
    assert!(live_text.contains("router"), "{live_text}");

    // Replay to each moment, out of order too, and draw with the operator's view.
    let mut replayer = Replayer::open(&file).expect("replay");
    let theme = Theme::default();
    let mut order: Vec<usize> = (0..captures.len()).collect();
    order.reverse();
    order.extend(0..captures.len());
    for i in order {
        let (at, app, live) = &captures[i];
        replayer.seek(*at).expect("seek");
        let mut app = app.clone();
        for table in &mut app.tables {
            table.invalidate();
        }
        let model = replayer.model();
        app.prepare(model);
        let mut replay_terminal = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).expect("terminal");
        replay_terminal
            .draw(|f| den_console::ui::draw(f, &app, model, &theme, *at))
            .expect("draw");
        let replayed = replay_terminal.backend().buffer();
        assert!(
            replayed == live,
            "frame {i} at {at} differs\n--- live ---\n{}\n--- replay ---\n{}",
            text(live),
            text(replayed)
        );
    }
}
