//! The replay's keys and timeline, driven like the terminal would.

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use den_protocol::time::Millis;

use super::Replayer;
use super::scan::Filter;
use super::tui::{Prompt, Replay, SPEEDS};
use crate::app::{Mode, Panel};
use crate::testing;
use crate::theme::Theme;

fn replay() -> Replay {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../recordings/synthetic/incident.jsonl");
    let r = Replayer::open(&path).unwrap();
    Replay::new(r, Theme::default(), "incident.jsonl".into(), 1.0)
}

fn key(r: &mut Replay, code: KeyCode) {
    r.key(KeyEvent::new(code, KeyModifiers::NONE)).unwrap();
}

fn typed(r: &mut Replay, text: &str) {
    for c in text.chars() {
        key(r, KeyCode::Char(c));
    }
}

fn screen(r: &mut Replay) -> String {
    let mut t = Terminal::new(TestBackend::new(140, 30)).unwrap();
    t.draw(|f| r.draw(f)).unwrap();
    testing::text(t.backend().buffer())
}

#[test]
fn playback_moves_with_time_and_speed_and_pauses() {
    let mut r = replay();
    r.advance(Duration::from_millis(1_500)).unwrap();
    assert_eq!(r.replayer.position(), Millis(1_500));
    key(&mut r, KeyCode::Char('+'));
    key(&mut r, KeyCode::Char('+'));
    assert_eq!(r.speed(), 4.0);
    r.advance(Duration::from_millis(1_000)).unwrap();
    assert_eq!(r.replayer.position(), Millis(5_500));
    key(&mut r, KeyCode::Char(' '));
    assert!(r.paused);
    r.advance(Duration::from_secs(5)).unwrap();
    assert_eq!(r.replayer.position(), Millis(5_500));
    for _ in 0..20 {
        key(&mut r, KeyCode::Char('-'));
    }
    assert_eq!(r.speed(), SPEEDS[0]);
    for _ in 0..20 {
        key(&mut r, KeyCode::Char('+'));
    }
    assert_eq!(r.speed(), 64.0);
    key(&mut r, KeyCode::Char(' '));
    r.advance(Duration::from_secs(60)).unwrap();
    assert_eq!(r.replayer.position(), r.replayer.end());
    assert!(r.paused, "playback stops at the end");
}

#[test]
fn jumps_steps_and_go_to() {
    let mut r = replay();
    key(&mut r, KeyCode::Char(']'));
    key(&mut r, KeyCode::Char(']'));
    assert_eq!(r.replayer.position(), Millis(20_000));
    key(&mut r, KeyCode::Char('['));
    assert_eq!(r.replayer.position(), Millis(10_000));
    let before = r.replayer.ordinal();
    key(&mut r, KeyCode::Right);
    assert!(r.paused);
    assert_eq!(r.replayer.ordinal(), before + 1);
    assert!(r.replayer.position() > Millis(10_000));
    key(&mut r, KeyCode::Left);
    key(&mut r, KeyCode::Left);
    assert_eq!(r.replayer.ordinal(), before - 1);
    key(&mut r, KeyCode::Char('t'));
    assert_eq!(r.prompt, Some(Prompt::Goto(String::new())));
    typed(&mut r, "12.5s");
    assert!(screen(&mut r).contains("go to: 12.5s"));
    key(&mut r, KeyCode::Enter);
    assert_eq!(r.prompt, None);
    assert_eq!(r.replayer.position(), Millis(12_500));
    key(&mut r, KeyCode::Char('t'));
    typed(&mut r, "soon");
    key(&mut r, KeyCode::Enter);
    assert!(
        r.message
            .as_ref()
            .is_some_and(|(_, m)| m.contains("not a time"))
    );
    assert_eq!(r.replayer.position(), Millis(12_500));
}

#[test]
fn find_and_next_previous_match() {
    let mut r = replay();
    key(&mut r, KeyCode::Char('f'));
    typed(&mut r, "failures");
    key(&mut r, KeyCode::Enter);
    assert_eq!(r.filter, Some(Filter::Failures));
    assert!(!r.matches.is_empty());
    let first = r.replayer.position();
    assert_eq!(first, r.matches[0].0);
    key(&mut r, KeyCode::Char('n'));
    let second = r.replayer.position();
    assert!(second > first);
    key(&mut r, KeyCode::Char('N'));
    assert_eq!(r.replayer.position(), first);
    // A request id, from the start.
    key(&mut r, KeyCode::Char('t'));
    typed(&mut r, "0");
    key(&mut r, KeyCode::Enter);
    key(&mut r, KeyCode::Char('f'));
    key(&mut r, KeyCode::Backspace);
    for _ in 0..20 {
        key(&mut r, KeyCode::Backspace);
    }
    typed(&mut r, "request-8");
    key(&mut r, KeyCode::Enter);
    assert_eq!(r.replayer.position(), Millis(11_999));
    let text = screen(&mut r);
    assert!(text.contains("find \"request-8\""), "{text}");
}

#[test]
fn commands_are_refused_and_panels_navigate() {
    let mut r = replay();
    r.replayer.seek(Millis(10_000)).unwrap();
    key(&mut r, KeyCode::Char('5'));
    assert_eq!(r.app.focus, Panel::Routes);
    key(&mut r, KeyCode::Char('c'));
    let flash = r.app.flash.clone().expect("refused");
    assert!(
        flash.text.contains("commands are disabled in a replay"),
        "{}",
        flash.text
    );
    assert_eq!(r.app.mode, Mode::Normal);
    key(&mut r, KeyCode::Char(':'));
    typed(&mut r, "delete 85bbd162");
    key(&mut r, KeyCode::Enter);
    assert_eq!(r.app.mode, Mode::Normal, "no confirmation is asked");
    assert!(r.app.flash.as_ref().unwrap().text.contains("disabled"));
    // Nothing was added to the recording's model.
    assert!(r.replayer.model().commands().len() == 1);
}

#[test]
fn the_screen_shows_the_panels_the_header_and_the_timeline() {
    let mut r = replay();
    r.markers = vec![Millis(12_000)];
    key(&mut r, KeyCode::Char('t'));
    typed(&mut r, "13s");
    key(&mut r, KeyCode::Enter);
    key(&mut r, KeyCode::Char(' '));
    let text = screen(&mut r);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("▶ REPLAY incident.jsonl"), "{}", lines[0]);
    assert!(lines[0].contains("00:13"), "{}", lines[0]);
    let status = lines[lines.len() - 2];
    assert!(
        status.contains("⏸ 1×") && status.contains("00:13.000 / 00:25.100"),
        "{status}"
    );
    let bar = lines[lines.len() - 1];
    assert!(
        bar.contains('●') && bar.contains('▲') && bar.contains('━'),
        "{bar}"
    );
    assert!(
        bar.find('▲') < bar.find('●'),
        "the marker is before the position"
    );
}
