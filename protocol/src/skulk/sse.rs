//! A small incremental `text/event-stream` parser, and Skulk's reading of it.
//!
//! Skulk's chat stream starts with `: keep-alive` and `: command_id <uuid>` comments,
//! may carry `: prefill_progress {json}` and `: generation_stats {json}` comments, sends
//! chunks as `data: {json}`, errors as `data: {"error": {...}}` (after status 200), and
//! ends with `data: [DONE]`.

use serde_json::Value;

use super::chat::ChatCompletionChunk;
use super::common::CommandId;
use super::error::ErrorEnvelope;

/// One dispatched event: the lines up to a blank line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// Comment lines (`: text`), without the colon and one leading space.
    pub comments: Vec<String>,
    pub event: Option<String>,
    /// `data:` lines joined with `\n`; `None` when the event had none.
    pub data: Option<String>,
    pub id: Option<String>,
}

impl SseEvent {
    fn is_empty(&self) -> bool {
        self.comments.is_empty() && self.event.is_none() && self.data.is_none() && self.id.is_none()
    }
}

/// Feed it chunks as they arrive; it returns each event once its blank line was read.
#[derive(Debug, Default)]
pub struct SseParser {
    line: String,
    pending: SseEvent,
    last_was_cr: bool,
}

impl SseParser {
    pub fn new() -> SseParser {
        SseParser::default()
    }

    pub fn push(&mut self, chunk: &str) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for c in chunk.chars() {
            match c {
                '\n' if self.last_was_cr => {
                    // The second half of a CRLF that was already handled at the CR.
                    self.last_was_cr = false;
                }
                '\n' | '\r' => {
                    self.last_was_cr = c == '\r';
                    let line = std::mem::take(&mut self.line);
                    self.take_line(&line, &mut out);
                }
                other => {
                    self.last_was_cr = false;
                    self.line.push(other);
                }
            }
        }
        out
    }

    /// Ends the stream: an unterminated last line and event are dispatched.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.take_line(&line, &mut out);
        }
        let pending = std::mem::take(&mut self.pending);
        if !pending.is_empty() {
            out.push(pending);
        }
        out
    }

    fn take_line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            let event = std::mem::take(&mut self.pending);
            if !event.is_empty() {
                out.push(event);
            }
            return;
        }
        if let Some(comment) = line.strip_prefix(':') {
            self.pending
                .comments
                .push(comment.strip_prefix(' ').unwrap_or(comment).to_owned());
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => match &mut self.pending.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.pending.data = Some(value.to_owned()),
            },
            "event" => self.pending.event = Some(value.to_owned()),
            "id" => self.pending.id = Some(value.to_owned()),
            // `retry` and unknown fields are ignored, as the SSE specification says.
            _ => {}
        }
    }
}

/// Parses a whole body at once.
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    let mut events = parser.push(body);
    events.extend(parser.finish());
    events
}

/// What one SSE event of a Skulk chat stream means.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    KeepAlive,
    /// `: command_id <uuid>`: usable with `POST /v1/cancel/{command_id}`.
    CommandId(CommandId),
    PrefillProgress(Value),
    GenerationStats(Value),
    /// Any other comment.
    Comment(String),
    Chunk(Box<ChatCompletionChunk>),
    /// An error sent in the body after status 200.
    Error(ErrorEnvelope),
    Done,
    /// A `data:` payload den could not read, kept raw.
    Data(String),
}

/// Interprets one event (comments first, then its data).
pub fn stream_items(event: &SseEvent) -> Vec<StreamItem> {
    let mut items: Vec<StreamItem> = event.comments.iter().map(|c| comment_item(c)).collect();
    if let Some(data) = &event.data {
        items.push(data_item(data));
    }
    items
}

fn comment_item(comment: &str) -> StreamItem {
    let (word, rest) = comment.split_once(' ').unwrap_or((comment, ""));
    match word {
        "keep-alive" => StreamItem::KeepAlive,
        "command_id" if !rest.trim().is_empty() => {
            StreamItem::CommandId(CommandId::from(rest.trim()))
        }
        "prefill_progress" => serde_json::from_str(rest)
            .map(StreamItem::PrefillProgress)
            .unwrap_or_else(|_| StreamItem::Comment(comment.to_owned())),
        "generation_stats" => serde_json::from_str(rest)
            .map(StreamItem::GenerationStats)
            .unwrap_or_else(|_| StreamItem::Comment(comment.to_owned())),
        _ => StreamItem::Comment(comment.to_owned()),
    }
}

fn data_item(data: &str) -> StreamItem {
    if data.trim() == "[DONE]" {
        return StreamItem::Done;
    }
    if let Ok(envelope) = serde_json::from_str::<ErrorEnvelope>(data) {
        return StreamItem::Error(envelope);
    }
    match serde_json::from_str::<ChatCompletionChunk>(data) {
        Ok(chunk) => StreamItem::Chunk(Box::new(chunk)),
        Err(_) => StreamItem::Data(data.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_on_blank_lines_across_chunk_boundaries() {
        let mut p = SseParser::new();
        let mut events = p.push(": keep-alive\r");
        events.extend(p.push("\n\r\ndata: a\ndata:"));
        events.extend(p.push(" b\n\n"));
        events.extend(p.finish());
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].comments, vec!["keep-alive".to_owned()]);
        assert_eq!(events[1].data.as_deref(), Some("a\nb"));
    }

    #[test]
    fn unterminated_last_event_is_dispatched_by_finish() {
        let events = parse_sse("data: [DONE]");
        assert_eq!(events.len(), 1);
        assert_eq!(stream_items(&events[0]), vec![StreamItem::Done]);
    }
}
