//! den-model's dequantizers and reader against gguf-py, an independent implementation:
//! `tests/golden/dequant.json`, written by `tests/golden/dequant_golden.py`.
//!
//! Tolerance: values must be bitwise-equal f32 (0 ulp), synthetic and real alike, stricter
//! than a 1e-6 relative bound. That is sound, not lucky: each value is one or two
//! IEEE-754 f32 operations (`d * q`, `d * q + m`, `(d * sc) * q`, `(d * sc) * q - dmin * m`),
//! and numpy and ggml perform the same operations in the same order, each correctly rounded,
//! with no fused multiply-add; f16 and bf16 widen exactly. Beyond the stored samples, a
//! sha256 of every dequantized value of each tensor must match too. The whole-tensor float64
//! sums are compared within 1e-6 relative, because numpy sums pairwise and this test in order.
//!
//! Real tensors need the model files: `tests/fetch-models`, then `DEN_TEST_MODELS=<dir>`.
//! Without it these tests print "skipped: ..." and pass, unless `DEN_TEST_REQUIRE_ALL=1`,
//! when they fail.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use den_model::gguf::{Array, GgufFile, Value};
use den_model::quant::{dequantize, dequantize_row};
use den_model::{GgmlType, weights_digest};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn golden() -> &'static Json {
    static GOLDEN: OnceLock<Json> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        serde_json::from_str(include_str!("../golden/dequant.json"))
            .expect("tests/golden/dequant.json")
    })
}

fn ty_named(name: &str) -> GgmlType {
    GgmlType::all()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

fn f32s_from_hex(s: &str) -> Vec<f32> {
    hex::decode(s)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn f32_sha256(values: &[f32]) -> String {
    let mut h = Sha256::new();
    for chunk in values.chunks(4096) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.update(&bytes);
    }
    hex::encode(h.finalize())
}

/// Bitwise equality, reporting the first difference.
fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: value {i} is {:e} ({:#010x}), gguf-py has {:e} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

fn assert_rel(got: f64, want: f64, what: &str) {
    let tol = 1e-6 * want.abs().max(f64::MIN_POSITIVE);
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got} vs gguf-py {want} (differs by {:e}, tolerance {tol:e})",
        (got - want).abs()
    );
}

/// The models directory, or `None` (after printing "skipped: ...") when not configured.
/// (Also used by `forward_real.rs`.)
pub(crate) fn models_dir(test: &str) -> Option<PathBuf> {
    match std::env::var_os("DEN_TEST_MODELS") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ if std::env::var("DEN_TEST_REQUIRE_ALL").as_deref() == Ok("1") => panic!(
            "{test}: DEN_TEST_MODELS is not set and DEN_TEST_REQUIRE_ALL=1: run tests/fetch-models and export the DEN_TEST_MODELS it prints"
        ),
        _ => {
            eprintln!(
                "skipped: {test}: DEN_TEST_MODELS is not set (run tests/fetch-models, then export DEN_TEST_MODELS)"
            );
            None
        }
    }
}

fn open_model(dir: &std::path::Path, model: &Json) -> GgufFile {
    crate::forward_real::open(dir, model["file"].as_str().unwrap())
}

fn models() -> &'static [Json] {
    golden()["models"].as_array().unwrap()
}

// --- without model files ----------------------------------------------------------------

#[test]
fn synthetic_blocks_match_gguf_py_bitwise() {
    let entries = golden()["synthetic"].as_array().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for e in entries {
        let ty = ty_named(e["type"].as_str().unwrap());
        let what = format!("{ty} ({})", e["description"].as_str().unwrap());
        let n = e["n_elements"].as_u64().unwrap() as usize;
        let raw = match e["raw_hex"].as_str() {
            Some(h) => hex::decode(h).unwrap(),
            None => {
                assert_eq!(e["raw"], "u16 0..=65535, little-endian", "{what}");
                (0..=u16::MAX).flat_map(u16::to_le_bytes).collect()
            }
        };
        let mut out = vec![f32::NAN; n];
        dequantize(ty, &raw, n, &mut out).unwrap();
        if let Some(h) = e["f32_hex"].as_str() {
            assert_bits_eq(&out, &f32s_from_hex(h), &what);
        }
        assert_eq!(
            f32_sha256(&out),
            e["f32_sha256"],
            "{what}: sha256 of all values"
        );
        // Row by row, with rows of one block and of two, gives the same values.
        let block = ty.block_size().max(32);
        for ne0 in [block, 2 * block] {
            if !n.is_multiple_of(ne0) {
                continue;
            }
            let mut row = vec![0.0; ne0];
            for r in 0..n / ne0 {
                dequantize_row(ty, &raw, ne0, r, &mut row).unwrap();
                assert_bits_eq(
                    &row,
                    &out[r * ne0..(r + 1) * ne0],
                    &format!("{what} row {r}"),
                );
            }
        }
        seen.insert(ty);
    }
    let want: std::collections::BTreeSet<_> =
        GgmlType::all().filter(|t| t.can_dequantize()).collect();
    assert_eq!(seen, want, "every supported type has synthetic golden data");
}

#[test]
fn golden_covers_every_supported_type() {
    // Synthetic or real, every dequantizable type is checked against gguf-py.
    let mut real = std::collections::BTreeSet::new();
    for m in models() {
        for t in m["tensors"].as_array().unwrap() {
            real.insert(ty_named(t["type"].as_str().unwrap()));
        }
    }
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::F32,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(
            real.contains(&ty),
            "{ty}: no real tensor in the golden data"
        );
    }
}

// --- with model files ---------------------------------------------------------------------

#[test]
fn real_tensors_match_gguf_py() {
    let Some(dir) = models_dir("real_tensors_match_gguf_py") else {
        return;
    };
    for m in models() {
        let f = open_model(&dir, m);
        for t in m["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let what = format!("{} {name}", f.name());
            let tensor = f.tensor(name).unwrap();
            assert_eq!(tensor.ggml_type().name(), t["type"], "{what}");
            assert_eq!(u64::from(tensor.ggml_type().id()), t["type_id"], "{what}");
            let dims: Vec<u64> = t["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(tensor.dims(), dims, "{what}");
            assert_eq!(tensor.n_elements(), t["n_elements"], "{what}");
            assert_eq!(tensor.data().len() as u64, t["n_bytes"], "{what}");
            assert_eq!(tensor.info().file_offset(), t["file_offset"], "{what}");

            let values = tensor.dequantize().unwrap();
            let first = f32s_from_hex(t["first_f32_hex"].as_str().unwrap());
            assert_bits_eq(
                &values[..first.len()],
                &first,
                &format!("{what} first values"),
            );
            for w in t["windows"].as_array().unwrap() {
                let at = w["offset"].as_u64().unwrap() as usize;
                let want = f32s_from_hex(w["f32_hex"].as_str().unwrap());
                assert_bits_eq(
                    &values[at..at + want.len()],
                    &want,
                    &format!("{what} values at {at}"),
                );
            }
            assert_eq!(
                f32_sha256(&values),
                t["f32_sha256"],
                "{what}: sha256 of all values"
            );
            let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
            let sum_sq: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            assert_rel(sum, t["sum"].as_f64().unwrap(), &format!("{what} sum"));
            assert_rel(
                sum_sq,
                t["sum_sq"].as_f64().unwrap(),
                &format!("{what} sum of squares"),
            );

            // Row by row gives the same values.
            let ne0 = tensor.ne0() as usize;
            let mut row = vec![0.0; ne0];
            for r in 0..tensor.rows() as usize {
                tensor.dequantize_row(r, &mut row).unwrap();
                assert_bits_eq(
                    &row,
                    &values[r * ne0..(r + 1) * ne0],
                    &format!("{what} row {r}"),
                );
            }
        }
    }
}

fn check_metadata_entry(f: &GgufFile, key: &str, want: &Json) {
    let what = format!("{} metadata {key:?}", f.name());
    let got = f.get(key).unwrap_or_else(|| panic!("{what}: missing"));
    let ty = want["type"].as_str().unwrap();
    match (got, ty) {
        (Value::String(s), "string") => match want.get("value") {
            Some(v) => assert_eq!(s, v.as_str().unwrap(), "{what}"),
            None => {
                assert_eq!(s.len() as u64, want["len"], "{what}");
                assert_eq!(
                    hex::encode(Sha256::digest(s.as_bytes())),
                    want["sha256"],
                    "{what}"
                );
            }
        },
        (Value::F32(v), "f32") => {
            assert_eq!(f64::from(*v), want["value"].as_f64().unwrap(), "{what}")
        }
        (Value::F64(v), "f64") => assert_eq!(*v, want["value"].as_f64().unwrap(), "{what}"),
        (Value::Bool(v), "bool") => assert_eq!(*v, want["value"].as_bool().unwrap(), "{what}"),
        (Value::Array(a), "array") => {
            assert_eq!(a.element_type().name(), want["element_type"], "{what}");
            assert_eq!(a.len() as u64, want["len"], "{what}");
            let mut h = Sha256::new();
            match a {
                Array::String(v) => {
                    for s in v {
                        h.update((s.len() as u64).to_le_bytes());
                        h.update(s.as_bytes());
                    }
                }
                Array::I32(v) => v.iter().for_each(|x| h.update(x.to_le_bytes())),
                Array::U32(v) => v.iter().for_each(|x| h.update(x.to_le_bytes())),
                Array::F32(v) => v.iter().for_each(|x| h.update(x.to_le_bytes())),
                other => panic!(
                    "{what}: no canonical hash here for arrays of {}",
                    other.element_type().name()
                ),
            }
            assert_eq!(hex::encode(h.finalize()), want["sha256"], "{what}");
        }
        (v, _) => {
            assert_eq!(v.value_type().name(), ty, "{what}");
            let n = v
                .as_i128()
                .unwrap_or_else(|| panic!("{what}: not an integer"));
            assert_eq!(n.to_string(), want["value"].to_string(), "{what}");
        }
    }
}

#[test]
fn real_metadata_and_layout_match_gguf_py() {
    let Some(dir) = models_dir("real_metadata_and_layout_match_gguf_py") else {
        return;
    };
    for m in models() {
        let f = open_model(&dir, m);
        assert_eq!(u64::from(f.version()), m["version"], "{}", f.name());
        assert_eq!(u64::from(f.alignment()), m["alignment"], "{}", f.name());
        assert_eq!(f.data_offset(), m["data_offset"], "{}", f.name());
        assert_eq!(f.tensors().len() as u64, m["tensor_count"], "{}", f.name());
        let want = m["metadata"].as_object().unwrap();
        assert_eq!(
            f.metadata().len(),
            want.len(),
            "{}: metadata entries",
            f.name()
        );
        for (key, entry) in want {
            check_metadata_entry(&f, key, entry);
        }
        let mut types = std::collections::BTreeMap::<String, u64>::new();
        for t in f.tensors() {
            *types.entry(t.ggml_type().name().to_owned()).or_default() += 1;
        }
        let want_types: std::collections::BTreeMap<String, u64> = m["types"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect();
        assert_eq!(types, want_types, "{}", f.name());
    }
    // The typed accessors a model loader will use.
    let smol = open_model(&dir, &models()[0]);
    assert_eq!(smol.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(smol.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(smol.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        smol.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    let gemma = open_model(&dir, &models()[1]);
    assert_eq!(gemma.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(gemma.get_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(
        gemma.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
        262144
    );
}

#[test]
fn real_weights_digest_matches_the_python_recomputation() {
    let Some(dir) = models_dir("real_weights_digest_matches_the_python_recomputation") else {
        return;
    };
    for m in models() {
        let f = open_model(&dir, m);
        let start = Instant::now();
        let digest = weights_digest(&f);
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "weights_digest {}: {:.0} MB in {secs:.2}s",
            f.name(),
            f.bytes().len() as f64 / 1e6
        );
        assert_eq!(hex::encode(digest), m["weights_digest"], "{}", f.name());
    }
}

/// `cargo test --release -p den-model --test it -- --ignored --nocapture throughput`
#[test]
#[ignore = "a measurement, not a check; run with --release"]
fn throughput() {
    let Some(dir) = models_dir("throughput") else {
        return;
    };
    for m in models() {
        let f = open_model(&dir, m);
        let mut by_type = std::collections::BTreeMap::<GgmlType, (u64, u64, f64)>::new();
        // One output buffer, touched before timing; each tensor decoded once untimed (page
        // faults on the map), then timed.
        let max = f
            .tensors()
            .iter()
            .map(|t| t.n_elements())
            .max()
            .unwrap_or(0);
        let mut buf = vec![1.0f32; max as usize];
        for t in f.tensor_views() {
            let out = &mut buf[..t.n_elements() as usize];
            t.dequantize_into(out).unwrap();
            let start = Instant::now();
            t.dequantize_into(out).unwrap();
            let e = by_type.entry(t.ggml_type()).or_default();
            e.0 += t.data().len() as u64;
            e.1 += t.n_elements();
            e.2 += start.elapsed().as_secs_f64();
            std::hint::black_box(&buf);
        }
        for (ty, (bytes, n, secs)) in by_type {
            eprintln!(
                "{} {ty}: {:.0} M values/s ({:.0} MB/s in, {:.1} M values)",
                m["file"].as_str().unwrap(),
                n as f64 / secs / 1e6,
                bytes as f64 / secs / 1e6,
                n as f64 / 1e6
            );
        }
    }
}
