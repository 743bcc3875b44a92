//! Text from the network made safe to print.
//!
//! A Skulk `/state` needs no den token, a worker names itself, and a recording replays
//! whatever was recorded: any of them can carry terminal control sequences (OSC 52 writes
//! the operator's clipboard, OSC 0 retitles the window, CSI 2J clears the screen) or a
//! newline that forges a log line. Every string from outside passes through [`printable`]
//! (one field, one line) or [`printable_lines`] (a whole report, keeping its own line
//! breaks) before it reaches a terminal or a log line.

use std::borrow::Cow;

/// `s` as one line of plain text: escape sequences (CSI, OSC, DCS and the rest) are
/// removed whole, other control characters (C0, DEL, C1, and the bidirectional
/// overrides that reorder what a terminal shows) become a space each.
pub fn printable(s: &str) -> Cow<'_, str> {
    clean(s, false)
}

/// Like [`printable`] but keeps `\n`: for a report whose line breaks are den's own and
/// whose fields were already made [`printable`] (or come from den itself).
pub fn printable_lines(s: &str) -> Cow<'_, str> {
    clean(s, true)
}

/// `s` as one short message line: [`printable`], with every run of whitespace (line
/// breaks included) made one space, trimmed. For error details that quote peer input.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in printable(s).split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn clean(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    if !s
        .chars()
        .any(|c| is_unsafe(c) && !(keep_newlines && c == '\n'))
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' if keep_newlines => out.push('\n'),
            '\u{1b}' => skip_escape(&mut chars),
            // C1 introducers of string and control sequences (8-bit forms of ESC P, ESC ],
            // ESC [, ESC X, ESC ^, ESC _).
            '\u{90}' | '\u{9d}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            '\u{9b}' => skip_csi(&mut chars),
            c if is_unsafe(c) => out.push(' '),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// After ESC: the rest of the sequence.
fn skip_escape(chars: &mut Chars<'_>) {
    match chars.next() {
        Some('[') => skip_csi(chars),
        Some(']' | 'P' | 'X' | '^' | '_') => skip_string(chars),
        // ESC ( B and friends: one intermediate, one final.
        Some('(' | ')' | '*' | '+' | '-' | '.' | '/' | '#' | '%' | ' ') => {
            chars.next();
        }
        // A two-character sequence (ESC c resets the terminal) or a lone ESC at the end.
        _ => {}
    }
}

/// A control sequence: parameters and intermediates up to a final byte in `@`..=`~`.
fn skip_csi(chars: &mut Chars<'_>) {
    for c in chars.by_ref() {
        if ('@'..='~').contains(&c) {
            return;
        }
        if !(' '..='?').contains(&c) {
            // Not a well-formed sequence: stop at the first character that cannot be
            // part of one (it is dropped too; better a lost character than a live code).
            return;
        }
    }
}

/// A string sequence (OSC, DCS, …): up to BEL, ST (ESC \) or the C1 ST.
fn skip_string(chars: &mut Chars<'_>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => return,
            '\u{1b}' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                return;
            }
            _ => {}
        }
    }
}

/// `512 B`, `1.5 KiB`, `12.0 MiB`, `1.2 GiB`, `3.4 TiB`.
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    match (unit, UNITS.get(unit)) {
        (0, _) => format!("{b} B"),
        (_, Some(u)) => format!("{v:.1} {u}"),
        (_, None) => format!("{b} B"),
    }
}

/// A node id cut for one line: libp2p peer ids all begin `12D3KooW`, so their head
/// names nothing; `…` and the last 8 characters do. Short ids are returned whole.
pub fn short_node(id: &str) -> String {
    match id.char_indices().rev().nth(7) {
        Some((at, _)) if id.len() > 12 => format!("…{}", &id[at..]),
        _ => id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        assert!(matches!(printable("gpu-a · 12D3KooW…"), Cow::Borrowed(_)));
        assert!(matches!(printable_lines("a\nb"), Cow::Borrowed(_)));
    }

    #[test]
    fn osc_csi_and_resets_are_removed_whole() {
        // OSC 52 (clipboard), with BEL and with ST; OSC 0 (title); CSI 2J (clear); ESC c.
        let hostile = "node\u{1b}]52;c;ZWNobyBwd25lZA==\u{7}-a\u{1b}]0;owned\u{1b}\\\u{1b}[2J\u{1b}[1;31mred\u{1b}[0m\u{1b}c!";
        assert_eq!(printable(hostile), "node-ared!");
        assert_eq!(printable("\u{9b}31mx\u{9d}0;t\u{9c}y"), "xy");
    }

    #[test]
    fn newlines_and_other_controls_cannot_forge_lines() {
        assert_eq!(
            printable("w1\nINFO router: worker admin logged in\r"),
            "w1 INFO router: worker admin logged in "
        );
        assert_eq!(printable_lines("a\nb\u{8}c\t"), "a\nb c ");
        // Bidi overrides reorder what the terminal shows.
        assert_eq!(printable("abc\u{202E}fed"), "abc fed");
    }

    #[test]
    fn a_truncated_sequence_at_the_end_is_dropped() {
        assert_eq!(printable("ok\u{1b}"), "ok");
        assert_eq!(printable("ok\u{1b}]52;c;AAAA"), "ok");
        assert_eq!(printable("ok\u{1b}[12"), "ok");
    }
}
