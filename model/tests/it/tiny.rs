//! Tiny tokenizers built here, for the tests that need no model files: GGUF metadata
//! written in memory, read back by the real reader, turned into a real `Tokenizer`.

use den_model::GgufFile;
use den_model::tokenizer::{Tokenizer, byte_to_char};

/// A metadata value for the writer.
pub enum Kv {
    U32(u32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
}

fn gstr(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A GGUF v3 file with these metadata and no tensors.
pub fn gguf(name: &str, kvs: Vec<(&str, Kv)>) -> GgufFile {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (key, v) in kvs {
        gstr(&mut b, key);
        match v {
            Kv::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::Bool(x) => {
                b.extend(7u32.to_le_bytes());
                b.push(u8::from(x));
            }
            Kv::Str(s) => {
                b.extend(8u32.to_le_bytes());
                gstr(&mut b, &s);
            }
            Kv::Strs(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for s in &v {
                    gstr(&mut b, s);
                }
            }
            Kv::I32s(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(5u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for x in v {
                    b.extend(x.to_le_bytes());
                }
            }
            Kv::F32s(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(6u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for x in v {
                    b.extend(x.to_le_bytes());
                }
            }
        }
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    GgufFile::from_bytes(name, b).expect("the tiny GGUF parses")
}

/// The byte-level tiny vocabulary: 3 control tokens (`<|endoftext|>` 0, `<|im_start|>` 1,
/// `<|im_end|>` 2), the 256 byte chars (byte b is id 3 + b), then the merges' results.
pub const BL_MERGES: &[(&str, &str)] = &[
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("Ġ", "w"),
    ("o", "r"),
    ("Ġw", "or"),
    ("l", "d"),
];

pub fn byte_level_file() -> GgufFile {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    tokens.extend((0..=255u8).map(|b| byte_to_char(b).to_string()));
    for (a, b) in BL_MERGES {
        tokens.push(format!("{a}{b}"));
    }
    let mut types = vec![3, 3, 3];
    types.resize(tokens.len(), 1);
    let merges = BL_MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    gguf(
        "tiny-bytelevel.gguf",
        vec![
            ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
            ("tokenizer.ggml.pre", Kv::Str("smollm".into())),
            ("tokenizer.ggml.tokens", Kv::Strs(tokens)),
            ("tokenizer.ggml.token_type", Kv::I32s(types)),
            ("tokenizer.ggml.merges", Kv::Strs(merges)),
            ("tokenizer.ggml.bos_token_id", Kv::U32(1)),
            ("tokenizer.ggml.eos_token_id", Kv::U32(2)),
            ("tokenizer.ggml.add_bos_token", Kv::Bool(false)),
        ],
    )
}

/// SmolLM2-like: byte-level BPE, ChatML control tokens.
pub fn byte_level() -> Tokenizer {
    Tokenizer::from_gguf(&byte_level_file()).expect("the tiny byte-level tokenizer builds")
}

/// The id of a byte in the byte-level tiny vocabulary.
pub fn bl_byte(b: u8) -> u32 {
    3 + u32::from(b)
}

/// The SentencePiece tiny vocabulary: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3,
/// `<start_of_turn>` 4, `<end_of_turn>` 5 (control), `\n` 6 and `\n\n` 7 (user-defined),
/// `<0x00>`..`<0xFF>` 8..263 (byte), then normal pieces with scores.
pub const SPM_PIECES: &[(&str, f32)] = &[
    ("▁", -1.0),
    ("a", -2.0),
    ("b", -3.0),
    ("c", -4.0),
    ("ab", -5.0),
    ("▁a", -6.0),
    ("▁ab", -7.0),
    ("bc", -8.0),
    ("abc", -9.0),
];

pub fn spm_file(add_space_prefix: bool) -> GgufFile {
    let mut tokens: Vec<String> = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<start_of_turn>",
        "<end_of_turn>",
        "\n",
        "\n\n",
    ]
    .map(String::from)
    .to_vec();
    let mut types = vec![3, 3, 3, 2, 3, 3, 4, 4];
    let mut scores = vec![-1000.0f32; 8];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, s) in SPM_PIECES {
        tokens.push((*p).to_owned());
        types.push(1);
        scores.push(*s);
    }
    gguf(
        "tiny-spm.gguf",
        vec![
            ("tokenizer.ggml.model", Kv::Str("llama".into())),
            ("tokenizer.ggml.tokens", Kv::Strs(tokens)),
            ("tokenizer.ggml.scores", Kv::F32s(scores)),
            ("tokenizer.ggml.token_type", Kv::I32s(types)),
            ("tokenizer.ggml.bos_token_id", Kv::U32(2)),
            ("tokenizer.ggml.eos_token_id", Kv::U32(1)),
            ("tokenizer.ggml.unknown_token_id", Kv::U32(3)),
            ("tokenizer.ggml.add_bos_token", Kv::Bool(true)),
            (
                "tokenizer.ggml.add_space_prefix",
                Kv::Bool(add_space_prefix),
            ),
        ],
    )
}

/// Gemma-like: SentencePiece with byte fallback, no space prefix.
pub fn spm() -> Tokenizer {
    Tokenizer::from_gguf(&spm_file(false)).expect("the tiny SentencePiece tokenizer builds")
}

/// The id of a byte token in the SentencePiece tiny vocabulary.
pub fn spm_byte(b: u8) -> u32 {
    8 + u32::from(b)
}

/// The id of a normal piece in the SentencePiece tiny vocabulary.
pub fn spm_piece(text: &str) -> u32 {
    264 + SPM_PIECES
        .iter()
        .position(|p| p.0 == text)
        .expect("a tiny piece") as u32
}
