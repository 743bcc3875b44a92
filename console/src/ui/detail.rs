//! Detail views: the full decision record of a route (every candidate with its score,
//! every attempt with its outcome, predicted against measured), the evidence of an
//! instance, and the raw fields of any other row.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use den_protocol::candidate::Scored;
use den_protocol::decision::{AttemptOutcome, DecisionRecord};
use den_protocol::time::Millis;

use crate::app::Panel;
use crate::app::table::TableRow;
use crate::model::{InstanceRow, Level, Model};
use crate::theme::Theme;

use super::cells::{deadline, ms};

#[allow(clippy::too_many_arguments)]
pub fn draw(
    frame: &mut Frame<'_>,
    body: Rect,
    panel: Panel,
    key: &str,
    scroll: u16,
    model: &Model,
    theme: &Theme,
    now: Millis,
) {
    let (title, lines) = match panel {
        Panel::Routes => match model.routes().iter().find(|r| r.request.as_str() == key) {
            Some(row) => (format!(" route {key} "), route_lines(&row.record, theme)),
            None => gone(key, theme),
        },
        Panel::Instances => {
            // A node row opens its whole instance.
            let all = &model.views().instances;
            let instance = all
                .iter()
                .find(|r| r.key() == key)
                .map_or(key, |r| r.instance());
            let rows: Vec<&InstanceRow> = all.iter().filter(|r| r.instance() == instance).collect();
            if rows.is_empty() {
                gone(key, theme)
            } else {
                let id = rows.first().map_or(key, |r| r.instance()).to_owned();
                (
                    format!(" instance {id} "),
                    instance_lines(&rows, theme, now),
                )
            }
        }
        _ => (
            format!(" {} {key} ", panel.title().to_lowercase()),
            raw_lines(panel, key, model, theme),
        ),
    };
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(theme.overlay().fg(theme.overlay.border))
        .style(theme.overlay())
        .title(Span::styled(
            title,
            theme.overlay().add_modifier(Modifier::BOLD),
        ))
        .title_bottom(Span::styled(
            " j/k scroll · esc back ",
            theme.overlay().fg(theme.ui.dim),
        ));
    frame.render_widget(Clear, body);
    // Wrapped, not truncated: a detail view shows every reason in full.
    let text = Paragraph::new(lines)
        .block(block)
        .wrap(ratatui::widgets::Wrap { trim: false })
        .scroll((scroll, 0));
    frame.render_widget(text, body);
}

fn gone(key: &str, theme: &Theme) -> (String, Vec<Line<'static>>) {
    (
        format!(" {key} "),
        vec![Line::from(Span::styled(
            "this row is gone (collected or no longer reported)",
            theme.missing(),
        ))],
    )
}

fn heading(text: &str, theme: &Theme) -> Line<'static> {
    Line::from(Span::styled(
        text.to_owned(),
        theme
            .overlay()
            .fg(theme.ui.title)
            .add_modifier(Modifier::BOLD),
    ))
}

fn plain(text: String, theme: &Theme) -> Line<'static> {
    Line::from(Span::styled(text, theme.overlay()))
}

fn opt_ms(v: Option<u64>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{v}ms"))
}

fn route_lines(r: &DecisionRecord, theme: &Theme) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let outcome = match &r.outcome {
        Some(o) => o.to_string(),
        None if r.is_waiting() => "waiting in the router for KV pages".to_owned(),
        None => "in flight".to_owned(),
    };
    let outcome_level = match &r.outcome {
        None if r.is_waiting() => Level::Warn,
        None => Level::Info,
        Some(den_protocol::decision::TerminalOutcome::Completed) => Level::Good,
        Some(den_protocol::decision::TerminalOutcome::Cancelled) => Level::Info,
        Some(den_protocol::decision::TerminalOutcome::Failed { .. }) => Level::Bad,
    };
    lines.push(plain(
        format!(
            "model {}   {} processed tokens + up to {} new   submitted {}   deadline {}",
            r.model, r.processed_tokens, r.max_new_tokens, r.submitted_at, r.deadline
        ),
        theme,
    ));
    lines.push(Line::from(vec![
        Span::styled("outcome ", theme.overlay()),
        Span::styled(outcome, theme.level(outcome_level).bg(theme.overlay.bg)),
        Span::styled(
            format!("   delivered {} tokens", r.delivered_tokens),
            theme.overlay(),
        ),
        Span::styled(
            if r.waited_ms > 0 {
                format!("   waited {} for KV pages", ms(r.waited_ms as f64))
            } else {
                String::new()
            },
            theme.overlay(),
        ),
    ]));
    let chosen = r.chosen().or(r.last_attempt());
    let predicted = chosen.map_or_else(|| "—".to_owned(), |a| ms(a.predicted_ttft_ms));
    lines.push(plain(
        format!(
            "TTFT predicted {predicted}   measured {}   cached tokens predicted {} actual {}",
            opt_ms(r.measured_ttft_ms),
            chosen.map_or_else(|| "—".to_owned(), |a| a.cached_tokens.to_string()),
            r.actual_cached_tokens
                .map_or_else(|| "—".to_owned(), |c| c.to_string()),
        ),
        theme,
    ));
    if let Some(t) = &r.worker_timings {
        lines.push(plain(
            format!(
                "worker timings: restore {} prefill {} first token {} decode {} total {}ms",
                opt_ms(t.restore_ms),
                opt_ms(t.prefill_ms),
                opt_ms(t.first_token_ms),
                opt_ms(t.decode_ms),
                t.total_ms
            ),
            theme,
        ));
    }
    lines.push(Line::raw(""));
    let ranking = r.candidates.ranking();
    let omitted = if r.candidates_omitted > 0 {
        format!(", {} more not kept after it finished", r.candidates_omitted)
    } else {
        String::new()
    };
    lines.push(heading(
        &format!(
            "candidates in offer order ({} feasible, {} infeasible{omitted})",
            ranking.feasible.len(),
            ranking.infeasible.len()
        ),
        theme,
    ));
    lines.push(Line::from(Span::styled(
        format!(
            " {:>2}  {:<14} {:<6} {:>7} {:>8} {:>8} {:>8} {:>9} {:>11}  {}",
            "#",
            "WORKER",
            "TIER",
            "CACHED",
            "QUEUE",
            "LOAD",
            "RESTORE",
            "PRED TTFT",
            "PAGES n/av",
            "NOTE"
        ),
        theme.header(),
    )));
    let attempted = |s: &Scored| {
        r.attempts.iter().find(|a| {
            a.worker == s.candidate.worker_id
                && a.tier == s.candidate.tier
                && a.cached_tokens == s.candidate.cached_token_count
                && a.resident_tokens == s.candidate.resident_head()
        })
    };
    for (i, s) in ranking.feasible.iter().enumerate() {
        let note = attempted(s).map_or_else(String::new, |a| {
            format!("attempt #{}: {}", a.attempt, a.outcome)
        });
        let style = match attempted(s).map(|a| &a.outcome) {
            Some(AttemptOutcome::Completed) => theme.level(Level::Good),
            Some(AttemptOutcome::Running | AttemptOutcome::Pending) => theme.level(Level::Info),
            Some(_) => theme.level(Level::Warn),
            None => theme.overlay(),
        };
        lines.push(candidate_line(
            &i.to_string(),
            s,
            &note,
            style.bg(theme.overlay.bg),
        ));
    }
    for s in &ranking.infeasible {
        let note = s
            .estimate
            .infeasible
            .map_or_else(|| "infeasible".to_owned(), |i| format!("infeasible: {i}"));
        lines.push(candidate_line(
            "–",
            s,
            &note,
            theme.dim().bg(theme.overlay.bg),
        ));
    }
    lines.push(Line::raw(""));
    lines.push(heading("attempts", theme));
    if r.attempts.is_empty() {
        lines.push(Line::from(Span::styled(" none yet", theme.missing())));
    }
    for a in &r.attempts {
        let level = match &a.outcome {
            AttemptOutcome::Completed => Level::Good,
            AttemptOutcome::Pending | AttemptOutcome::Running | AttemptOutcome::Cancelled => {
                Level::Info
            }
            AttemptOutcome::Superseded => Level::Info,
            _ => Level::Warn,
        };
        let at = |t: Option<Millis>| t.map_or_else(|| "—".to_owned(), |t| t.to_string());
        lines.push(Line::from(vec![
            Span::styled(
                format!(
                    " #{:<2} {:<14} {:<6} cached {:>6}  pred {:>8}  offered {} accepted {} ended {}  ",
                    a.attempt,
                    a.worker.as_str(),
                    a.tier.as_str(),
                    a.cached_tokens,
                    ms(a.predicted_ttft_ms),
                    a.offered_at,
                    at(a.accepted_at),
                    at(a.ended_at),
                ),
                theme.overlay(),
            ),
            Span::styled(a.outcome.to_string(), theme.level(level).bg(theme.overlay.bg)),
        ]));
    }
    lines
}

fn candidate_line(rank: &str, s: &Scored, note: &str, style: Style) -> Line<'static> {
    let c = &s.candidate;
    let e = &s.estimate;
    // A lower-tier alternative that forks a resident head restores only the rest: say so,
    // or its restore reads as the whole prefix's.
    let head = c.resident_head();
    let note = if head > 0 {
        let head = format!("head {head} resident");
        if note.is_empty() {
            head
        } else {
            format!("{head}; {note}")
        }
    } else {
        note.to_owned()
    };
    let pred = if e.feasible() {
        ms(e.ttft_ms)
    } else {
        "—".to_owned()
    };
    Line::from(Span::styled(
        format!(
            " {:>2}  {:<14} {:<6} {:>7} {:>8} {:>8} {:>8} {:>9} {:>11}  {}",
            rank,
            c.worker_id.as_str(),
            c.tier.as_str(),
            c.cached_token_count,
            ms(c.queue_ms),
            ms(c.prefix_load_ms),
            ms(c.gpu_restore_ms),
            pred,
            format!("{}/{}", e.required_pages, e.available_pages),
            note
        ),
        style,
    ))
}

fn instance_lines(rows: &[&InstanceRow], theme: &Theme, now: Millis) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    for row in rows {
        match row {
            InstanceRow::Instance {
                model,
                presence,
                context_limit,
                verdict,
                failures,
                tasks,
                ..
            } => {
                lines.push(plain(
                    format!(
                        "model {}   {presence}   context limit {}",
                        model.as_deref().unwrap_or("—"),
                        context_limit.map_or_else(|| "—".to_owned(), |c| c.to_string())
                    ),
                    theme,
                ));
                let mut v = vec![
                    Span::styled("verdict ", theme.overlay()),
                    Span::styled(
                        verdict.kind.clone(),
                        theme.level(verdict.level).bg(theme.overlay.bg),
                    ),
                ];
                if let Some(d) = verdict.deadline {
                    v.push(Span::styled("   deadline ", theme.overlay()));
                    v.extend(deadline(d, now, theme).spans);
                }
                lines.push(Line::from(v));
                lines.push(Line::raw(""));
                lines.push(heading("reasons", theme));
                if verdict.reasons.is_empty() && failures.is_empty() {
                    lines.push(plain(" none".to_owned(), theme));
                }
                for r in failures.iter().chain(&verdict.reasons) {
                    lines.push(plain(format!(" • {r}"), theme));
                }
                lines.push(Line::raw(""));
                lines.push(heading("tasks", theme));
                if tasks.is_empty() {
                    lines.push(plain(" none in /state".to_owned(), theme));
                }
                for t in tasks {
                    lines.push(plain(format!(" • {t}"), theme));
                }
                lines.push(Line::raw(""));
                lines.push(heading("evidence per assigned node", theme));
            }
            InstanceRow::Assignment {
                node,
                runner,
                download,
                runner_status,
                probe,
                membership,
                backend,
                ..
            } => {
                let backend = backend
                    .as_deref()
                    .map_or_else(String::new, |b| format!("   backend {b}"));
                lines.push(plain(
                    format!(" node {node}   runner {runner}{backend}"),
                    theme,
                ));
                for (what, e) in [
                    ("membership", membership),
                    ("download", download),
                    ("runner", runner_status),
                    ("probe", probe),
                ] {
                    lines.push(Line::from(vec![
                        Span::styled(format!("   {what:<11}"), theme.overlay()),
                        Span::styled(
                            format!("{} ", e.mark.symbol()),
                            theme.mark(e.mark).bg(theme.overlay.bg),
                        ),
                        Span::styled(e.note.clone(), theme.overlay()),
                    ]));
                }
            }
        }
    }
    lines
}

/// Any other row: its fields as `name: value`, one per line.
fn raw_lines(panel: Panel, key: &str, model: &Model, theme: &Theme) -> Vec<Line<'static>> {
    let value = match panel {
        Panel::Nodes => find(&model.views().nodes, key),
        Panel::Downloads => find(&model.views().downloads, key),
        Panel::Pages => find(&model.views().pages, key),
        Panel::Events => find(model.events(), key),
        Panel::Routes | Panel::Instances => None,
    };
    let Some(serde_json::Value::Object(map)) = value else {
        return gone(key, theme).1;
    };
    map.into_iter()
        .map(|(k, v)| {
            let v = match v {
                serde_json::Value::String(s) => s,
                serde_json::Value::Null => "—".to_owned(),
                other => other.to_string(),
            };
            Line::from(vec![
                Span::styled(format!("{k:>20}  "), theme.overlay().fg(theme.ui.dim)),
                Span::styled(v, theme.overlay()),
            ])
        })
        .collect()
}

fn find<R: TableRow + serde::Serialize>(rows: &[R], key: &str) -> Option<serde_json::Value> {
    rows.iter()
        .find(|r| r.key() == key)
        .and_then(|r| serde_json::to_value(r).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::candidate::{Candidate, estimate_shape};

    fn scored(json: &str) -> Scored {
        let candidate: Candidate = serde_json::from_str(json).unwrap();
        let estimate = estimate_shape(99, 4, &candidate);
        Scored {
            candidate,
            estimate,
        }
    }

    fn text(line: &Line) -> String {
        line.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn a_lower_tier_alternative_with_a_resident_head_says_so() {
        let base = r#""worker_id":"w-a","worker_epoch":0,"cached_token_count":99,
            "cached_bytes":0,"queue_ms":0,"prefix_load_ms":1,"gpu_restore_ms":1,
            "prefill_ms_per_token":1,"first_token_ms":1,"page_size":16,"free_pages":64,
            "evictable_pages":0,"max_context":4096,"online":true,"model_loaded":true"#;
        let mixed = scored(&format!(
            r#"{{{base},"tier":"ram","resident_token_count":32}}"#
        ));
        let line = text(&candidate_line(
            "0",
            &mixed,
            "attempt #1: completed",
            Style::default(),
        ));
        assert!(
            line.ends_with("head 32 resident; attempt #1: completed"),
            "{line}"
        );
        let whole = scored(&format!(r#"{{{base},"tier":"ram"}}"#));
        let line = text(&candidate_line("1", &whole, "", Style::default()));
        assert!(!line.contains("resident"), "{line}");
        let gpu = scored(&format!(r#"{{{base},"tier":"gpu"}}"#));
        let line = text(&candidate_line("2", &gpu, "", Style::default()));
        assert!(!line.contains("resident"), "{line}");
    }
}
