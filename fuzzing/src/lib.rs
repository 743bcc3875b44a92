//! den's fuzz targets, as plain functions over bytes.
//!
//! Each takes what a hostile or broken peer could hand den and runs it through the
//! decoder that meets it in production, then through what consumes the decoded value
//! (the console's model for a Skulk `/state` or a feed frame, the dequantizers for a GGUF
//! tensor), checking the properties den promises: no panic, no unbounded work, and errors
//! that are one line. libFuzzer drives them from `fuzz/` (nightly, see fuzz/README.md);
//! `tests/corpora.rs` replays every stored corpus input and every past crash through the
//! same functions on the stable toolchain, so a regression fails `tests/run`.
//!
//! A target never asserts on content it cannot predict; it asserts what must hold for
//! every input.

use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;

use den_protocol::ids::WorkerId;
use den_protocol::session::{SessionEvent, SourceId, Stamped};
use den_protocol::time::Millis;

/// A fuzz target: bytes in, a panic when a promise breaks.
pub type Target = fn(&[u8]);

/// Every target: its name (the directory under fuzz/corpus) and its function.
pub const TARGETS: &[(&str, Target)] = &[
    ("wire", wire),
    ("http_body", http_body),
    ("skulk", skulk),
    ("recording", recording),
    ("recording_lines", recording_lines),
    ("gguf", gguf),
    ("theme", theme),
    ("config", config),
];

/// Largest frame the targets accept: big enough for any interesting structure, small
/// enough that the size cap itself is exercised.
const MAX_FRAME: usize = 1 << 20;

/// The promise every decoder makes about its errors: one line, no control characters.
fn one_line(what: &str, message: &str) {
    assert!(
        !message.chars().any(char::is_control),
        "{what} error is not one clean line: {message:?}"
    );
}

/// The worker↔router wire (both directions) and the router's console feed.
pub fn wire(data: &[u8]) {
    let me = WorkerId::new("w-fuzz");
    if let Err(e) = den_protocol::wire::decode_for_router(data, MAX_FRAME) {
        one_line("wire (to router)", &e.to_string());
    }
    if let Err(e) = den_protocol::wire::decode_for_worker(data, MAX_FRAME, &me) {
        one_line("wire (to worker)", &e.to_string());
    }
    match den_protocol::feed::decode(data, MAX_FRAME) {
        Err(e) => one_line("feed", &e.to_string()),
        // A frame that decodes reaches the console's model, as it would live.
        Ok(message) => {
            let mut model = den_console::model::Model::new(Default::default());
            model.apply(&Stamped {
                at: Millis(1),
                event: SessionEvent::Feed {
                    source: SourceId::new("router"),
                    message,
                },
            });
            model.settle();
        }
    }
}

/// Every HTTP body parser of the router, chosen by the first byte: OpenAI chat and
/// completions, `/tokenize` and `/detokenize`, `/v1/generate`, `POST /instance`, and the
/// management API's query strings.
pub fn http_body(data: &[u8]) {
    use den_agent::ingress::{parse, tokenize};
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let json = || serde_json::from_slice::<Value>(body).ok();
    match which % 7 {
        0 => {
            if let Some(v) = json() {
                let _ = parse::chat(&v);
            }
        }
        1 => {
            if let Some(v) = json() {
                let _ = parse::completion(&v);
            }
        }
        2 => {
            if let Some(Value::Object(obj)) = json() {
                let _ = tokenize::tokenize_body(&obj);
            }
        }
        3 => {
            if let Some(Value::Object(obj)) = json() {
                let _ = tokenize::detokenize_body(&obj);
            }
        }
        4 => {
            if let Err(e) = den_agent::router::generate::decode_body(body) {
                one_line("/v1/generate body", &e);
            }
        }
        5 => {
            let _ = serde_json::from_slice::<den_protocol::skulk::CreateInstanceRequest>(body);
        }
        _ => {
            let query = String::from_utf8_lossy(body);
            let _ = den_agent::router::manage::http::parse_query(&query);
        }
    }
}

/// Skulk's answers as the console decodes them, chosen by the first byte; a `/state`
/// that decodes goes through the console's model.
pub fn skulk(data: &[u8]) {
    use den_protocol::skulk::{self, decode_response};
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(body);
    let status = if which & 0x80 != 0 { 500 } else { 200 };
    let check = |what: &str, r: Result<(), skulk::ResponseError>| {
        if let Err(e) = r {
            one_line(what, &e.to_string());
        }
    };
    match which % 9 {
        0 => match decode_response::<skulk::State>(status, &text, "state") {
            Err(e) => one_line("/state", &e.to_string()),
            Ok(state) => {
                let mut model = den_console::model::Model::new(Default::default());
                model.apply(&Stamped {
                    at: Millis(1),
                    event: SessionEvent::SkulkState {
                        source: SourceId::new("skulk"),
                        state: Box::new(state),
                        latency_ms: 1,
                        received_unix_ms: None,
                    },
                });
                model.settle();
            }
        },
        1 => {
            // A chat stream, whole and cut in two at a byte the input picks: the same
            // events either way (a network read can end anywhere).
            let whole = skulk::sse::parse_sse(&text);
            let cut = usize::from(which).min(text.len());
            let cut = (0..=cut)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            let mut parser = skulk::sse::SseParser::new();
            let mut split = parser.push(&text[..cut]);
            split.extend(parser.push(&text[cut..]));
            split.extend(parser.finish());
            assert_eq!(whole, split, "SSE events depend on where the body was cut");
            for event in &whole {
                let _ = skulk::sse::stream_items(event);
            }
        }
        2 => check(
            "/node/identity",
            decode_response::<skulk::NodeIdentityResponse>(status, &text, "identity").map(drop),
        ),
        3 => check(
            "/instance/previews",
            decode_response::<skulk::PreviewsResponse>(status, &text, "previews").map(drop),
        ),
        4 => check(
            "POST /instance",
            decode_response::<skulk::CreateInstanceResponse>(status, &text, "create").map(drop),
        ),
        5 => check(
            "DELETE /instance",
            decode_response::<skulk::DeleteInstanceResponse>(status, &text, "delete").map(drop),
        ),
        6 => check(
            "/models",
            decode_response::<skulk::ModelList>(status, &text, "models").map(drop),
        ),
        7 => check(
            "/events",
            decode_response::<Vec<skulk::Event>>(status, &text, "events").map(drop),
        ),
        _ => {
            let e = skulk::ApiError::from_response(400 + u16::from(which % 100), &text);
            one_line("API error", &e.to_string());
        }
    }
}

thread_local! {
    /// One scratch file per thread: the recording reader works on files (it seeks, and
    /// walks zstd frames), so each input is written there first. On tmpfs where there is
    /// one: on a disk, writing each input back cost block I/O, 60 % of the target's time.
    static SCRATCH: Option<(tempfile::TempDir, PathBuf)> = scratch_dir()
        .map(|d| {
            let p = d.path().join("fuzz.den");
            (d, p)
        });
}

fn scratch_dir() -> Option<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return Some(d);
    }
    tempfile::tempdir().ok()
}

/// A recording file (plain or zstd): open it, replay every event, seek back and forth.
pub fn recording(data: &[u8]) {
    SCRATCH.with(|scratch| {
        let Some((_, path)) = scratch else {
            return;
        };
        let written = std::fs::File::create(path).and_then(|mut f| f.write_all(data));
        if written.is_err() {
            return;
        }
        let mut replayer = match den_console::replay::Replayer::open(path) {
            Ok(r) => r,
            Err(e) => return one_line("recording", &e.to_string()),
        };
        // Bounded: a replay steps at most once per line of the input.
        let mut steps = 0;
        while steps <= data.len() {
            match replayer.step_forward() {
                Ok(true) => steps += 1,
                Ok(false) => break,
                Err(e) => return one_line("recording", &e.to_string()),
            }
        }
        let (start, end) = (replayer.start(), replayer.end());
        let middle = Millis(start.0 + end.0.saturating_sub(start.0) / 2);
        for t in [middle, start, end] {
            if let Err(e) = replayer.seek(t) {
                return one_line("recording seek", &e.to_string());
            }
        }
        let _ = replayer.step_back();
        let _ = replayer.model();
    });
}

/// A recording's lines without the file around them: the first as a header, the rest
/// as events (whole or delta-encoded) decoded and applied to the model as the replayer
/// does. The parsing half of the reader, at a speed that lets it run millions of times;
/// [`recording`] covers the file, its segments, zstd frames and seeking.
pub fn recording_lines(data: &[u8]) {
    let mut lines = data.split(|b| *b == b'\n');
    if let Some(first) = lines.next()
        && let Err(e) = den_protocol::recording::decode_header(first)
    {
        one_line("recording header", &e.to_string());
    }
    let mut model = den_console::model::Model::new(Default::default());
    let mut codec = den_console::record::codec::Codec::new();
    for line in lines.take(64) {
        match codec.decode(line, &model) {
            Ok(stamped) => model.apply(&stamped),
            Err(e) => one_line("recording line", &e.to_string()),
        }
    }
    model.settle();
}

/// A GGUF file: header, metadata, tensor table, and a dequantized row of each tensor.
pub fn gguf(data: &[u8]) {
    let file = match den_model::gguf::GgufFile::from_bytes("fuzz.gguf", data.to_vec()) {
        Ok(f) => f,
        Err(e) => return one_line("gguf", &e.to_string()),
    };
    for (_, value) in file.metadata().iter() {
        let _ = value.describe();
    }
    let mut row = Vec::new();
    for tensor in file.tensor_views().take(16) {
        // A row is what the forward pass dequantizes at a time; keep it small.
        let Ok(ne0) = usize::try_from(tensor.ne0()) else {
            continue;
        };
        if ne0 == 0 || ne0 > 1 << 16 {
            continue;
        }
        row.resize(ne0, 0.0);
        if let Err(e) = tensor.dequantize_row(0, &mut row) {
            one_line("gguf tensor", &e.to_string());
        }
    }
}

/// Small GGUF files made here, one per tensor type den reads (llama metadata, a
/// three-token vocabulary, one 256×2 tensor of pseudo-random blocks): the `gguf`
/// target's seeds, built rather than committed (no model file lives in the tree).
pub fn gguf_seeds() -> Vec<(String, Vec<u8>)> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn key(out: &mut Vec<u8>, k: &str, ty: u32) {
        string(out, k);
        out.extend_from_slice(&ty.to_le_bytes());
    }
    // (name, ggml type id, elements per block, bytes per block)
    const TYPES: [(&str, u32, usize, usize); 9] = [
        ("F32", 0, 1, 4),
        ("F16", 1, 1, 2),
        ("Q4_0", 2, 32, 18),
        ("Q4_1", 3, 32, 20),
        ("Q5_0", 6, 32, 22),
        ("Q8_0", 8, 32, 34),
        ("Q4_K", 12, 256, 144),
        ("Q6_K", 14, 256, 210),
        ("BF16", 30, 1, 2),
    ];
    let mut state = 7u64;
    TYPES
        .iter()
        .map(|&(name, ty, per, size)| {
            let ne0 = 256usize;
            let mut out = b"GGUF".to_vec();
            out.extend_from_slice(&3u32.to_le_bytes());
            out.extend_from_slice(&1u64.to_le_bytes()); // tensors
            out.extend_from_slice(&5u64.to_le_bytes()); // metadata pairs
            key(&mut out, "general.architecture", 8);
            string(&mut out, "llama");
            key(&mut out, "general.alignment", 4);
            out.extend_from_slice(&32u32.to_le_bytes());
            key(&mut out, "llama.context_length", 4);
            out.extend_from_slice(&128u32.to_le_bytes());
            key(&mut out, "llama.rope.freq_base", 6);
            out.extend_from_slice(&10000f32.to_le_bytes());
            key(&mut out, "tokenizer.ggml.tokens", 9);
            out.extend_from_slice(&8u32.to_le_bytes());
            out.extend_from_slice(&3u64.to_le_bytes());
            for t in ["a", "b", "<s>"] {
                string(&mut out, t);
            }
            string(&mut out, &format!("t.{name}"));
            out.extend_from_slice(&2u32.to_le_bytes());
            out.extend_from_slice(&(ne0 as u64).to_le_bytes());
            out.extend_from_slice(&2u64.to_le_bytes());
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes()); // offset
            out.resize(out.len().next_multiple_of(32), 0);
            for _ in 0..ne0 / per * size * 2 {
                // xorshift: fixed, varied block bytes.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                out.push(state as u8);
            }
            (format!("one-{name}.gguf"), out)
        })
        .collect()
}

/// A console theme file.
pub fn theme(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = den_console::theme::Theme::parse(&text, "fuzz.toml") {
        one_line("theme", &e.to_string());
    }
}

/// The console's and the agent's config files, and the agent's options built from one.
/// Paths in the file are dropped before the options are built: they would name files
/// the fuzzer does not control.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match den_console::config::parse_file(&text, "console.toml") {
        Err(e) => one_line("console config", &e.to_string()),
        Ok(mut file) => {
            file.token_file = None;
            file.ca_cert = None;
            let args = den_console::config::CommonArgs::default();
            if let Err(e) = den_console::config::resolve(&args, file) {
                one_line("console settings", &e.to_string());
            }
        }
    }
    match den_agent::config::parse::<den_agent::cli::FileConfig>("agent.toml".as_ref(), &text) {
        Err(e) => one_line("agent config", &e.to_string()),
        Ok(file) => {
            let mut router = file.router;
            router.token_file = None;
            router.api_keys_file = None;
            router.catalog = None;
            router.catalog_cache = None;
            router.model_files.clear();
            router.tls_cert = None;
            router.tls_key = None;
            let args = den_agent::cli::RouterArgs::default();
            if let Err(e) = den_agent::cli::router_options(&args, &router) {
                one_line("router options", &e);
            }
        }
    }
}
