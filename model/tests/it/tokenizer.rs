//! The tokenizers: on tiny vocabularies built here (always), and on the real models
//! against llama.cpp's `llama-tokenize` (`tests/golden/tokens_*.json`, written by
//! `tests/golden/tokenize_golden.sh`): den's ids must be identical for every text, and
//! decoding must give the text back.
//!
//! The real-model tests need `tests/fetch-models` (the GGUFs and Gemma 3's
//! `tokenizer.json`), then `DEN_TEST_MODELS=<dir>`; without it they print "skipped: ..."
//! and pass, unless `DEN_TEST_REQUIRE_ALL=1`.

use std::path::PathBuf;
use std::sync::OnceLock;

use den_model::GgufFile;
use den_model::tokenizer::{
    Detokenizer, EncodeOptions, TokenKind, Tokenizer, TokenizerModel, sentencepiece_merges,
};
use serde_json::Value as Json;

use crate::tiny::{self, Kv, bl_byte, spm_byte, spm_piece};

// --- tiny vocabularies ------------------------------------------------------------------

fn plain(add_special: bool) -> EncodeOptions {
    EncodeOptions {
        add_special,
        parse_special: false,
    }
}

#[test]
fn byte_level_bpe_merges_and_splits_digits() {
    let t = tiny::byte_level();
    assert_eq!(t.model(), TokenizerModel::ByteLevelBpe);
    assert_eq!(t.n_vocab(), 3 + 256 + tiny::BL_MERGES.len());
    let id = |s: &str| t.token_id(s).unwrap();
    assert_eq!(t.encode("hello", true).unwrap(), vec![id("hello")]);
    assert_eq!(
        t.encode("hello world", false).unwrap(),
        vec![id("hello"), id("Ġwor"), id("ld")]
    );
    // smollm: each digit alone, never merged with its neighbours.
    assert_eq!(
        t.encode("x123", false).unwrap(),
        vec![bl_byte(b'x'), bl_byte(b'1'), bl_byte(b'2'), bl_byte(b'3')]
    );
    // add_bos is false: add_special adds nothing.
    assert!(!t.add_bos());
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert_eq!(t.eog_ids(), &[0, 2]);
}

#[test]
fn control_tokens_match_only_when_parsing_special_tokens() {
    let t = tiny::byte_level();
    let chat = "<|im_start|>hello<|im_end|>";
    assert_eq!(
        t.encode(chat, false).unwrap(),
        vec![1, t.token_id("hello").unwrap(), 2]
    );
    let literal = t.encode_with(chat, plain(false)).unwrap();
    assert_eq!(literal.first(), Some(&bl_byte(b'<')));
    assert!(!literal.contains(&1) && !literal.contains(&2));
    assert_eq!(
        t.decode(&literal, true),
        chat,
        "as text they decode to themselves"
    );
    let ids = t.encode(chat, false).unwrap();
    assert_eq!(t.decode(&ids, false), chat);
    assert_eq!(t.decode(&ids, true), "hello");
    assert!(t.is_special(1) && !t.is_special(bl_byte(b'a')));
    assert_eq!(t.token_kind(1), Some(TokenKind::Control));
}

#[test]
fn byte_level_round_trips_any_text() {
    let t = tiny::byte_level();
    for text in [
        "",
        " ",
        "  a\tb\n\nc ",
        "héllo wörld 日本語 😀 e\u{301}",
        "12 3.5",
    ] {
        let ids = t.encode(text, true).unwrap();
        assert_eq!(t.decode(&ids, false), text);
    }
}

#[test]
fn sentencepiece_merges_by_score_and_falls_back_to_bytes() {
    let t = tiny::spm();
    assert_eq!(t.model(), TokenizerModel::SentencePiece);
    assert!(t.add_bos());
    // "▁ab" outranks nothing, but "ab" (-5) beats "▁a" (-6): ▁ + ab, then ▁ab (-7).
    assert_eq!(t.encode(" ab", false).unwrap(), vec![spm_piece("▁ab")]);
    assert_eq!(t.encode("ab", true).unwrap(), vec![2, spm_piece("ab")]);
    // "bc" (-8) loses to "ab" (-5): ab + c, and "abc" (-9) comes from ab + c.
    assert_eq!(t.encode("abc", false).unwrap(), vec![spm_piece("abc")]);
    // € is not in the vocabulary: its three bytes.
    assert_eq!(
        t.encode("a€", false).unwrap(),
        vec![
            spm_piece("a"),
            spm_byte(0xE2),
            spm_byte(0x82),
            spm_byte(0xAC)
        ]
    );
    // User-defined tokens match even without parse_special; control ones only with it.
    assert_eq!(
        t.encode_with("a\n\n\nb", plain(false)).unwrap(),
        vec![spm_piece("a"), 7, 6, spm_piece("b")]
    );
    assert_eq!(
        t.encode("<start_of_turn>a<end_of_turn>", false).unwrap(),
        vec![4, spm_piece("a"), 5]
    );
    let text = "a b€\n\nc";
    assert_eq!(t.decode(&t.encode(text, false).unwrap(), false), text);
    assert_eq!(
        t.decode(&t.encode(text, true).unwrap(), false),
        format!("<bos>{text}")
    );
    assert_eq!(t.decode(&t.encode(text, true).unwrap(), true), text);
    assert_eq!(t.eog_ids(), &[1, 5]);
}

#[test]
fn sentencepiece_space_prefix_goes_at_the_start_and_after_special_tokens() {
    let t = Tokenizer::from_gguf(&tiny::spm_file(true)).unwrap();
    assert_eq!(t.encode("ab", false).unwrap(), vec![spm_piece("▁ab")]);
    assert_eq!(
        t.encode("a<end_of_turn>ab", false).unwrap(),
        vec![spm_piece("▁a"), 5, spm_piece("▁ab")]
    );
}

#[test]
fn streaming_never_splits_a_character() {
    // Byte-level: € is three byte pieces with no merge.
    let t = tiny::byte_level();
    let ids = t.encode("a€b", false).unwrap();
    assert_eq!(
        ids,
        vec![
            bl_byte(b'a'),
            bl_byte(0xE2),
            bl_byte(0x82),
            bl_byte(0xAC),
            bl_byte(b'b')
        ]
    );
    let mut d = Detokenizer::new(true);
    let got: Vec<String> = ids.iter().map(|&id| d.push(&t, id).to_owned()).collect();
    assert_eq!(got, vec!["a", "", "", "€", "b"]);
    assert!(!d.has_pending());
    assert_eq!(d.finish(), "");

    // SentencePiece byte fallback: 😀 is four byte tokens.
    let s = tiny::spm();
    let ids = s.encode("😀", false).unwrap();
    assert_eq!(ids.len(), 4);
    let mut d = Detokenizer::new(true);
    let got: Vec<String> = ids.iter().map(|&id| d.push(&s, id).to_owned()).collect();
    assert_eq!(got, vec!["", "", "", "😀"]);

    // A sequence that cannot complete: U+FFFD where from_utf8_lossy puts it.
    for ids in [
        vec![spm_byte(0xE2), spm_piece("a")],
        vec![
            spm_byte(0xE2),
            spm_byte(0x82),
            spm_byte(0xE2),
            spm_byte(0x82),
            spm_byte(0xAC),
        ],
        vec![
            spm_byte(0xFF),
            spm_byte(0x80),
            spm_piece("a"),
            spm_byte(0xF0),
        ],
    ] {
        let mut d = Detokenizer::new(false);
        let mut streamed: String = ids.iter().map(|&id| d.push(&s, id).to_owned()).collect();
        streamed.push_str(d.finish());
        assert_eq!(streamed, s.decode(&ids, false), "{ids:?}");
        assert!(streamed.contains('\u{FFFD}'));
    }
    let mut d = Detokenizer::new(false);
    assert_eq!(d.push(&s, spm_byte(0xE2)), "");
    assert!(d.has_pending());
    assert_eq!(d.finish(), "\u{FFFD}");
    // skip_special hides control tokens; ids outside the vocabulary add nothing.
    let mut d = Detokenizer::new(true);
    assert_eq!(d.push(&s, 2), "");
    assert_eq!(d.push(&s, 1_000_000), "");
    let mut d = Detokenizer::new(false);
    assert_eq!(d.push(&s, 2), "<bos>");
}

#[test]
fn errors_are_one_line_and_name_the_file() {
    use tiny::gguf;
    let err = |kvs: Vec<(&str, Kv)>| {
        let e = Tokenizer::from_gguf(&gguf("bad.gguf", kvs))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("bad.gguf: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let toks = || Kv::Strs(vec!["a".into(), "b".into()]);
    let e = err(vec![("tokenizer.ggml.tokens", toks())]);
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("bert".into())),
        ("tokenizer.ggml.tokens", toks()),
    ]);
    assert!(e.contains("unsupported tokenizer \"bert\""), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("qwen2".into())),
        ("tokenizer.ggml.tokens", toks()),
    ]);
    assert!(e.contains("pre-tokenizer \"qwen2\""), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("llama".into())),
        ("tokenizer.ggml.tokens", toks()),
        ("tokenizer.ggml.scores", Kv::F32s(vec![0.0])),
    ]);
    assert!(e.contains("tokenizer.ggml.scores has 1 entries"), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("gpt-2".into())),
        ("tokenizer.ggml.tokens", toks()),
        ("tokenizer.ggml.merges", Kv::Strs(vec!["ab".into()])),
    ]);
    assert!(e.contains("merge #0 \"ab\""), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("gpt-2".into())),
        ("tokenizer.ggml.tokens", toks()),
        ("tokenizer.ggml.merges", Kv::Strs(vec!["a b".into()])),
    ]);
    assert!(e.contains("ab"), "a merge whose result is not a token: {e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("gpt-2".into())),
        ("tokenizer.ggml.tokens", toks()),
        ("tokenizer.ggml.merges", Kv::Strs(vec![])),
        ("tokenizer.ggml.eos_token_id", Kv::U32(9)),
    ]);
    assert!(
        e.contains("eos token id 9 is outside the vocabulary of 2"),
        "{e}"
    );
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", Kv::Strs(vec![])),
    ]);
    assert!(e.contains("empty"), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", toks()),
    ]);
    assert!(
        e.contains("pre-tokenizer \"default\""),
        "no pre: llama.cpp's default regex: {e}"
    );
    let e = Tokenizer::from_tokenizer_json("/nonexistent/tokenizer.json")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/tokenizer.json: "), "{e}");
}

// --- the real models against llama.cpp --------------------------------------------------

use crate::dequant::models_dir;

pub fn model_file(dir: &std::path::Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run tests/fetch-models (DEN_TEST_MODELS={})",
        path.display(),
        dir.display()
    );
    path
}

pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";
pub const GEMMA3_JSON: &str = "gemma3-tokenizer.json";

/// A real model's GGUF and tokenizer, loaded once per test binary.
pub struct Loaded {
    pub file: GgufFile,
    pub tokenizer: Tokenizer,
}

fn load(dir: &std::path::Path, name: &str) -> Loaded {
    let file = GgufFile::open(model_file(dir, name)).unwrap();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    Loaded { file, tokenizer }
}

pub fn smollm2(test: &str) -> Option<&'static Loaded> {
    static CELL: OnceLock<Loaded> = OnceLock::new();
    let dir = models_dir(test)?;
    Some(CELL.get_or_init(|| load(&dir, SMOLLM2)))
}

pub fn gemma3(test: &str) -> Option<&'static Loaded> {
    static CELL: OnceLock<Loaded> = OnceLock::new();
    let dir = models_dir(test)?;
    Some(CELL.get_or_init(|| load(&dir, GEMMA3)))
}

fn gemma3_json(test: &str) -> Option<&'static Tokenizer> {
    static CELL: OnceLock<Tokenizer> = OnceLock::new();
    let dir = models_dir(test)?;
    Some(
        CELL.get_or_init(|| Tokenizer::from_tokenizer_json(model_file(&dir, GEMMA3_JSON)).unwrap()),
    )
}

struct Case {
    name: String,
    text: String,
    opts: EncodeOptions,
    ids: Vec<u32>,
    round_trip: bool,
}

fn golden(file: &str) -> Vec<Case> {
    let json: Json = serde_json::from_str(file).expect("the golden tokens parse");
    let cases = json["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30, "{} cases", cases.len());
    cases
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_owned(),
            text: c["text"].as_str().unwrap().to_owned(),
            opts: EncodeOptions {
                add_special: c["add_special"].as_bool().unwrap(),
                parse_special: c["parse_special"].as_bool().unwrap(),
            },
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect(),
            round_trip: c["round_trip"].as_bool().unwrap(),
        })
        .collect()
}

fn smollm2_golden() -> Vec<Case> {
    golden(include_str!("../golden/tokens_smollm2.json"))
}

fn gemma3_golden() -> Vec<Case> {
    golden(include_str!("../golden/tokens_gemma3.json"))
}

/// Every case's ids must equal llama.cpp's; all mismatches are reported together.
fn assert_tokenizes_like_llama_cpp(t: &Tokenizer, cases: &[Case], what: &str) {
    let mut bad = Vec::new();
    for c in cases {
        let got = t.encode_with(&c.text, c.opts).unwrap();
        if got != c.ids {
            bad.push(format!(
                "  {} {:?}\n    den:       {got:?}\n    llama.cpp: {:?}",
                c.name, c.text, c.ids
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {} texts tokenize differently from llama.cpp:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

/// decode(encode(x)) == x where the text can round-trip (BOS, when added, is left out),
/// and streaming the ids gives the same text as decoding them whole.
fn assert_round_trips(t: &Tokenizer, cases: &[Case], what: &str) {
    let mut n = 0;
    for c in cases {
        let mut ids = c.ids.as_slice();
        if c.opts.add_special && t.add_bos() && ids.first() == t.bos().as_ref() {
            ids = &ids[1..];
        }
        let whole = t.decode(ids, false);
        if c.round_trip {
            assert_eq!(whole, c.text, "{what}: {} does not round-trip", c.name);
            n += 1;
        }
        let mut d = Detokenizer::new(false);
        let mut streamed: String = ids.iter().map(|&id| d.push(t, id).to_owned()).collect();
        streamed.push_str(d.finish());
        assert_eq!(streamed, whole, "{what}: {} streams differently", c.name);
    }
    assert!(n >= 25, "{what}: only {n} round-trip cases");
}

#[test]
fn smollm2_tokenizes_like_llama_cpp() {
    let Some(m) = smollm2("smollm2_tokenizes_like_llama_cpp") else {
        return;
    };
    let cases = smollm2_golden();
    assert_tokenizes_like_llama_cpp(&m.tokenizer, &cases, SMOLLM2);
    assert_round_trips(&m.tokenizer, &cases, SMOLLM2);
}

#[test]
fn gemma3_tokenizes_like_llama_cpp() {
    let Some(m) = gemma3("gemma3_tokenizes_like_llama_cpp") else {
        return;
    };
    let cases = gemma3_golden();
    assert_tokenizes_like_llama_cpp(&m.tokenizer, &cases, GEMMA3);
    assert_round_trips(&m.tokenizer, &cases, GEMMA3);
}

/// The tokenizer.json route tokenizes like llama.cpp on the GGUF too, but for two known
/// differences of the files themselves (the GGUF route matches llama.cpp on both):
/// - `sentencepiece_mark_runs`: the file spells its whitespace-run tokens `▁▁`... and merges
///   literal U+2581 runs into them; the GGUF spells them with spaces, so llama.cpp cannot.
/// - `specials_as_text`: `<start_of_image>` is special in the file, user-defined in the
///   GGUF, so only the GGUF matches it with `parse_special = false`.
#[test]
fn gemma3_tokenizer_json_tokenizes_like_llama_cpp() {
    let Some(t) = gemma3_json("gemma3_tokenizer_json_tokenizes_like_llama_cpp") else {
        return;
    };
    let known = ["sentencepiece_mark_runs", "specials_as_text"];
    let (cases, differ): (Vec<Case>, Vec<Case>) = gemma3_golden()
        .into_iter()
        .partition(|c| !known.contains(&c.name.as_str()));
    assert_eq!(differ.len(), known.len());
    assert_tokenizes_like_llama_cpp(t, &cases, GEMMA3_JSON);
    assert_round_trips(t, &cases, GEMMA3_JSON);
    for c in &differ {
        assert_ne!(
            t.encode_with(&c.text, c.opts).unwrap(),
            c.ids,
            "{} now matches: drop it from known",
            c.name
        );
    }
}

#[test]
fn smollm2_vocabulary_facts() {
    let Some(m) = smollm2("smollm2_vocabulary_facts") else {
        return;
    };
    let t = &m.tokenizer;
    assert_eq!(t.model(), TokenizerModel::ByteLevelBpe);
    assert_eq!(t.n_vocab(), 49_152);
    let specials: Vec<u32> = (0..t.n_vocab() as u32)
        .filter(|&i| t.is_special(i))
        .collect();
    assert_eq!(specials, (0..17).collect::<Vec<_>>());
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(1), Some(2), false));
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
    assert_eq!(t.eog_ids(), &[0, 2]);
}

#[test]
fn gemma3_vocabulary_facts() {
    let Some(m) = gemma3("gemma3_vocabulary_facts") else {
        return;
    };
    let t = &m.tokenizer;
    assert_eq!(t.model(), TokenizerModel::SentencePiece);
    assert_eq!(t.n_vocab(), 262_144);
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(2), Some(1), true));
    assert_eq!(t.special_id("<start_of_turn>"), Some(105));
    assert_eq!(t.special_id("<end_of_turn>"), Some(106));
    assert_eq!(t.eog_ids(), &[1, 106]);
    assert_eq!(t.token_kind(107), Some(TokenKind::UserDefined));
    assert_eq!(t.piece(107), Some(&b"\n"[..]));
    assert_eq!(t.token_kind(238), Some(TokenKind::Byte));
}

/// The tokenizer.json route sees the same vocabulary as the GGUF: every id's text and
/// kind, BOS, EOS and the end-of-generation tokens. Known differences: one id more,
/// `<image_soft_token>`, past the model's embedding rows; `<start_of_image>` and
/// `<end_of_image>`, special in the file, are user-defined in the GGUF (the converter saw
/// them unspecial), which only changes them under `parse_special = false` and
/// `skip_special`.
#[test]
fn gemma3_tokenizer_json_vocabulary_equals_the_gguf() {
    let Some(m) = gemma3("gemma3_tokenizer_json_vocabulary_equals_the_gguf") else {
        return;
    };
    let j = gemma3_json("gemma3_tokenizer_json_vocabulary_equals_the_gguf").unwrap();
    let g = &m.tokenizer;
    assert_eq!(j.n_vocab(), g.n_vocab() + 1);
    assert_eq!(j.token_text(262_144), Some("<image_soft_token>"));
    let mut bad = Vec::new();
    for id in 0..g.n_vocab() as u32 {
        let (gt, jt) = (
            (g.token_text(id), g.token_kind(id)),
            (j.token_text(id), j.token_kind(id)),
        );
        let image = [255_999, 256_000].contains(&id)
            && gt == (jt.0, Some(TokenKind::UserDefined))
            && jt.1 == Some(TokenKind::Control);
        if gt != jt && !image {
            bad.push(format!("{id}: gguf {gt:?}, tokenizer.json {jt:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} ids differ:\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
    assert_eq!(
        (j.bos(), j.eos(), j.add_bos(), j.add_eos()),
        (g.bos(), g.eos(), g.add_bos(), g.add_eos())
    );
    assert_eq!(j.eog_ids(), g.eog_ids());
}

/// The merges den derives from the GGUF's scores are Hugging Face's, in order, for every
/// normal token. (The others make user-defined whitespace runs, which the GGUF spells
/// with spaces and the file with `▁`, scored -1000 in the GGUF and 0 in the file; llama.cpp
/// and den match those tokens before any merge runs.)
#[test]
fn gemma3_merges_from_scores_equal_the_tokenizer_json_merges() {
    let Some(dir) = models_dir("gemma3_merges_from_scores_equal_the_tokenizer_json_merges") else {
        return;
    };
    let file = GgufFile::open(model_file(&dir, GEMMA3)).unwrap();
    let texts = file.get_str_array("tokenizer.ggml.tokens").unwrap();
    let scores = file.get_f32_array("tokenizer.ggml.scores").unwrap();
    let types = file.get_i32_array("tokenizer.ggml.token_type").unwrap();
    let index: std::collections::HashMap<&str, usize> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let makes_normal = |m: &(String, String)| {
        index
            .get(format!("{}{}", m.0, m.1).as_str())
            .is_some_and(|&i| TokenKind::from_gguf(types[i]) == TokenKind::Normal)
    };
    let all_ours = sentencepiece_merges(texts, scores);
    assert!(all_ours.len() > 500_000, "{}", all_ours.len());
    let ours: Vec<_> = all_ours.into_iter().filter(makes_normal).collect();
    let json: Json =
        serde_json::from_slice(&std::fs::read(model_file(&dir, GEMMA3_JSON)).unwrap()).unwrap();
    let theirs: Vec<(String, String)> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::Array(p) => (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            ),
            Json::String(s) => {
                let (a, b) = s.split_once(' ').unwrap();
                (a.to_owned(), b.to_owned())
            }
            other => panic!("merge {other}"),
        })
        .filter(makes_normal)
        .collect();
    assert_eq!(ours.len(), theirs.len(), "merge counts");
    let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
    assert_eq!(
        first,
        None,
        "first difference at #{:?}: den {:?}, tokenizer.json {:?}",
        first,
        first.map(|i| &ours[i]),
        first.map(|i| &theirs[i])
    );
}
