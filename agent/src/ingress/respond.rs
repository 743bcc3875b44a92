//! Response bodies: `chat.completion`, `text_completion` and their streamed chunks.
//!
//! Stream frames are built from a per-request prefix rendered once (id, object, created,
//! model, fingerprint), so a delta costs one JSON string escape and a few copies. Every
//! frame is one SSE event: `data: {json}\n\n`; the stream ends with `data: [DONE]\n\n`.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;

use den_protocol::wire::{StopReason, WorkerResult};

use super::error::ApiError;

/// The SSE terminator.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Which API shape a request answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
        }
    }

    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        }
    }
}

/// Token counts for `usage`, from the worker's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u32,
    pub completion: u32,
    /// The worker's actual reused prefix, never more than the prompt.
    pub cached: u32,
}

impl Usage {
    pub fn from_result(prompt: u32, result: &WorkerResult) -> Self {
        Usage {
            prompt,
            completion: u32::try_from(result.tokens.len()).unwrap_or(u32::MAX),
            cached: result.cached_token_count.min(prompt),
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt.saturating_add(self.completion),
            "prompt_tokens_details": {"cached_tokens": self.cached},
            "completion_tokens_details": {"reasoning_tokens": 0},
        })
    }
}

/// `length` when decoding stopped at the token limit or the context's end, else `stop`
/// (spec §9).
pub fn finish_reason(result: &WorkerResult, limit: u32) -> &'static str {
    let at_limit = result.tokens.len() >= limit as usize;
    match result.stop {
        Some(StopReason::Length | StopReason::Capacity) => "length",
        // The model stopped itself, even on its last allowed token.
        Some(StopReason::Eos) => "stop",
        _ if at_limit => "length",
        _ => "stop",
    }
}

/// The fixed part of every object one request answers with.
#[derive(Debug, Clone)]
pub struct Shape {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    /// The public model id the client asked for.
    pub model: String,
    /// The model fingerprint, surfaced as `system_fingerprint`.
    pub fingerprint: String,
    pub include_usage: bool,
    /// `data: {"id":…,"object":…,"created":…,"model":…,"system_fingerprint":…,"choices":[`
    chunk_head: String,
}

impl Shape {
    pub fn new(
        endpoint: Endpoint,
        id: String,
        created: u64,
        model: String,
        fingerprint: String,
        include_usage: bool,
    ) -> Self {
        let object = match endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut head = String::from("data: {\"id\":");
        push_json_str(&mut head, &id);
        head.push_str(",\"object\":\"");
        head.push_str(object);
        head.push_str("\",\"created\":");
        head.push_str(&created.to_string());
        head.push_str(",\"model\":");
        push_json_str(&mut head, &model);
        head.push_str(",\"system_fingerprint\":");
        push_json_str(&mut head, &fingerprint);
        head.push_str(",\"choices\":[");
        Shape {
            endpoint,
            id,
            created,
            model,
            fingerprint,
            include_usage,
            chunk_head: head,
        }
    }

    /// The non-streamed 200 body. `served_by` names the model instance that served it
    /// (den's router knows it for placed models).
    pub fn full(
        &self,
        text: &str,
        finish: &str,
        usage: &Usage,
        served_by: Option<&str>,
    ) -> Vec<u8> {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": finish,
            }),
            Endpoint::Completions => json!({
                "text": text,
                "index": 0,
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        };
        let mut body = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [choice],
            "usage": usage.json(),
        });
        if let (Some(instance), Some(map)) = (served_by, body.as_object_mut()) {
            map.insert("served_by".to_owned(), json!(instance));
        }
        // Serialising a `Value` cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The first chat chunk, announcing the assistant role; none for completions.
    pub fn role_chunk(&self) -> Option<Bytes> {
        match self.endpoint {
            Endpoint::Chat => Some(self.chunk(
                "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}",
            )),
            Endpoint::Completions => None,
        }
    }

    /// One chunk of generated text.
    pub fn content_chunk(&self, text: &str) -> Bytes {
        let mut choice = String::with_capacity(text.len() + 96);
        match self.endpoint {
            Endpoint::Chat => {
                choice.push_str("{\"index\":0,\"delta\":{\"content\":");
                push_json_str(&mut choice, text);
                choice.push_str("},\"logprobs\":null,\"finish_reason\":null}");
            }
            Endpoint::Completions => {
                choice.push_str("{\"text\":");
                push_json_str(&mut choice, text);
                choice.push_str(",\"index\":0,\"logprobs\":null,\"finish_reason\":null}");
            }
        }
        self.chunk(&choice)
    }

    /// The last choice chunk: empty delta (or text) and the finish reason.
    pub fn finish_chunk(&self, finish: &str) -> Bytes {
        let mut choice = String::with_capacity(96);
        match self.endpoint {
            Endpoint::Chat => {
                choice.push_str("{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":")
            }
            Endpoint::Completions => {
                choice.push_str("{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":")
            }
        }
        push_json_str(&mut choice, finish);
        choice.push('}');
        self.chunk(&choice)
    }

    /// The extra chunk with `choices: []` and the usage (when `include_usage`).
    pub fn usage_chunk(&self, usage: &Usage) -> Bytes {
        let mut b = BytesMut::with_capacity(self.chunk_head.len() + 200);
        b.put_slice(self.chunk_head.as_bytes());
        b.put_slice(b"],\"usage\":");
        b.put_slice(usage.json().to_string().as_bytes());
        b.put_slice(b"}\n\n");
        b.freeze()
    }

    fn chunk(&self, choice: &str) -> Bytes {
        let mut b = BytesMut::with_capacity(self.chunk_head.len() + choice.len() + 20);
        b.put_slice(self.chunk_head.as_bytes());
        b.put_slice(choice.as_bytes());
        b.put_slice(b"]");
        if self.include_usage {
            b.put_slice(b",\"usage\":null");
        }
        b.put_slice(b"}\n\n");
        b.freeze()
    }
}

/// The error frame of a stream that fails after it started: the error envelope as one
/// SSE event (the official clients raise it as an `APIError`).
pub fn error_frame(error: &ApiError) -> Bytes {
    let body = error.body();
    let mut b = BytesMut::with_capacity(body.len() + 8);
    b.put_slice(b"data: ");
    b.put_slice(&body);
    b.put_slice(b"\n\n");
    b.freeze()
}

fn push_json_str(out: &mut String, s: &str) {
    // Serialising a string cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn frame_json(b: &Bytes) -> Value {
        let s = std::str::from_utf8(b).unwrap();
        let s = s
            .strip_prefix("data: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn chunks_are_valid_json_with_the_openai_fields() {
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            let s = Shape::new(
                endpoint,
                "id-\"1".into(),
                7,
                "m\\x".into(),
                "fp".into(),
                true,
            );
            let c = frame_json(&s.content_chunk("a \"quoted\"\nline"));
            assert_eq!(c["id"], "id-\"1");
            assert_eq!(c["model"], "m\\x");
            assert!(c["usage"].is_null() && c.get("usage").is_some());
            let text = match endpoint {
                Endpoint::Chat => &c["choices"][0]["delta"]["content"],
                Endpoint::Completions => &c["choices"][0]["text"],
            };
            assert_eq!(text, "a \"quoted\"\nline");
            let f = frame_json(&s.finish_chunk("length"));
            assert_eq!(f["choices"][0]["finish_reason"], "length");
            let u = frame_json(&s.usage_chunk(&Usage {
                prompt: 5,
                completion: 3,
                cached: 2,
            }));
            assert_eq!(u["choices"], serde_json::json!([]));
            assert_eq!(u["usage"]["total_tokens"], 8);
            assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        }
        let s = Shape::new(
            Endpoint::Chat,
            "i".into(),
            1,
            "m".into(),
            "fp".into(),
            false,
        );
        let r = frame_json(&s.role_chunk().unwrap());
        assert_eq!(r["choices"][0]["delta"]["role"], "assistant");
        assert!(r.get("usage").is_none());
    }

    #[test]
    fn finish_reason_is_length_at_the_limit_or_context_end() {
        let mut r = WorkerResult::completed(vec![1, 2], 0);
        assert_eq!(finish_reason(&r, 2), "length");
        r.stop = Some(StopReason::Eos);
        assert_eq!(finish_reason(&r, 5), "stop");
        assert_eq!(
            finish_reason(&r, 2),
            "stop",
            "a stop on the last allowed token"
        );
        r.stop = None;
        assert_eq!(finish_reason(&r, 2), "length");
        r.stop = Some(StopReason::Capacity);
        assert_eq!(finish_reason(&r, 5), "length");
    }
}
