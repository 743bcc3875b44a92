//! The summary as text: the incident timeline, then each topic.

use std::fmt::Write;

use den_protocol::recording::Offset;
use den_protocol::time::Millis;

use super::*;

fn t(at: Millis) -> String {
    Offset(at).to_string()
}

/// The summary as text.
pub fn text(s: &Summary) -> String {
    let mut out = String::new();
    let i = &s.recording;
    let _ = writeln!(
        out,
        "den recording {} (format {}, den {}, host {})",
        i.id, i.format_version, i.den_version, i.host
    );
    for f in &i.files {
        let _ = writeln!(out, "  file {f}");
    }
    let _ = writeln!(
        out,
        "  started {}; {} to {} ({} events); redaction {}",
        i.started_at,
        t(Millis(i.start_ms)),
        t(Millis(i.end_ms)),
        i.events,
        i.redaction
    );
    if i.missing_start {
        out.push_str("  earlier segments are missing (deleted by retention?): the summary starts at the first one found\n");
    }

    out.push_str("\nSOURCES\n");
    for src in &s.sources {
        let _ = write!(out, "  {} ({} {})", src.source, src.kind, src.url);
        if !src.connected.is_empty() {
            let times: Vec<String> = src.connected.iter().map(|a| t(*a)).collect();
            let _ = write!(out, ": connected {}", times.join(", "));
        }
        for (at, reason) in &src.disconnected {
            let _ = write!(out, "; disconnected {}: {reason}", t(*at));
        }
        out.push('\n');
    }

    out.push_str("\nTIMELINE\n");
    if s.timeline.is_empty() {
        out.push_str("  nothing happened\n");
    }
    for item in &s.timeline {
        let source = item
            .source
            .as_ref()
            .map_or(String::new(), |s| format!("[{s}] "));
        let _ = writeln!(out, "  {}  {source}{}", t(item.at), item.text);
    }

    out.push_str("\nWORKERS\n");
    if s.workers.is_empty() {
        out.push_str("  none\n");
    }
    for w in &s.workers {
        let _ = write!(
            out,
            "  {} on node {}: joined {}",
            w.worker,
            w.node,
            t(w.joined_at)
        );
        for (at, reason) in &w.left {
            let _ = write!(out, "; left {} ({reason})", t(*at));
        }
        out.push('\n');
    }

    out.push_str("\nPLACEMENTS AND OTHER COMMANDS\n");
    if s.commands.is_empty() {
        out.push_str("  none\n");
    }
    for c in &s.commands {
        let outcome = c.outcome.as_ref().map_or_else(
            || "no outcome recorded".to_owned(),
            |(at, status, detail)| format!("{status} at {}: {detail}", t(*at)),
        );
        let _ = writeln!(
            out,
            "  #{} {} (issued {}): {outcome}",
            c.id,
            c.text,
            t(c.issued_at)
        );
        for (at, note) in &c.progress {
            let _ = writeln!(out, "      {}  {note}", t(*at));
        }
    }

    out.push_str("\nREQUESTS FAILED OR RETRIED\n");
    if s.requests.is_empty() {
        out.push_str("  none\n");
    }
    for q in &s.requests {
        let attempts: Vec<String> = q
            .attempts
            .iter()
            .map(|a| format!("#{} {} {}", a.attempt, a.worker, a.outcome))
            .collect();
        let fallback = q
            .fallback
            .as_ref()
            .map_or_else(String::new, |w| format!("; fallback {w}"));
        let _ = writeln!(
            out,
            "  {} ({}, first seen {}): {}; attempts: {}{fallback}",
            q.request,
            q.model,
            t(q.seen_at),
            q.outcome,
            attempts.join(", ")
        );
    }
    if s.requests_not_listed > 0 {
        let _ = writeln!(out, "  … and {} more", s.requests_not_listed);
    }

    out.push_str("\nDOWNLOAD FAILURES\n");
    if s.download_failures.is_empty() {
        out.push_str("  none\n");
    }
    for d in &s.download_failures {
        let _ = writeln!(out, "  {}  {} on {}: {}", t(d.at), d.model, d.node, d.error);
    }

    out.push_str("\nREADINESS CHANGES\n");
    if s.readiness.is_empty() {
        out.push_str("  none\n");
    }
    for c in &s.readiness {
        let _ = writeln!(
            out,
            "  {}  {} ({}): {}{}",
            t(c.at),
            c.instance,
            c.model.as_deref().unwrap_or("?"),
            c.verdict,
            if c.reasons.is_empty() {
                String::new()
            } else {
                format!(": {}", c.reasons.join("; "))
            }
        );
    }

    out.push_str("\nPAGE PRESSURE (lowest free pages per worker)\n");
    if s.page_pressure.is_empty() {
        out.push_str("  no page pools reported\n");
    }
    for p in &s.page_pressure {
        let used = 100.0 - 100.0 * p.lowest_free as f64 / p.total_pages.max(1) as f64;
        let _ = writeln!(
            out,
            "  {} (node {}): {} of {} pages free ({used:.1}% used) at {}",
            p.worker,
            p.node,
            p.lowest_free,
            p.total_pages,
            t(p.at)
        );
    }

    out.push_str("\nRECORDING PROBLEMS\n");
    let pr = &s.problems;
    if pr.dropped.is_empty() && pr.torn.is_empty() && pr.skipped_lines == 0 {
        out.push_str("  none\n");
    }
    for (at, n) in &pr.dropped {
        let _ = writeln!(
            out,
            "  {n} events dropped before {} (the recorder could not keep up)",
            t(*at)
        );
    }
    for (file, bytes) in &pr.torn {
        let _ = match bytes {
            // A zstd stream cut mid-frame ends in an error with no partial line in hand.
            0 => writeln!(
                out,
                "  {file}: the compressed stream ends early (the recorder stopped mid-write); everything before the cut was read"
            ),
            _ => writeln!(
                out,
                "  {file}: the last {bytes} bytes are an incomplete line (the recorder stopped mid-write)"
            ),
        };
    }
    if pr.skipped_lines > 0 {
        let _ = writeln!(out, "  {} lines could not be read", pr.skipped_lines);
    }
    out
}
