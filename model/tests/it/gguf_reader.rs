//! The GGUF reader on GGUF bytes built here: every metadata type, arrays, alignment,
//! tensor views, and errors (never panics) on truncated, corrupt and hostile input.

use den_model::gguf::{Array, ErrorKind, Gguf, GgufFile, MAX_ARRAY_DEPTH, Value, ValueType};
use den_model::quant::QuantError;
use den_model::{GgmlType, weights_digest};

// --- a GGUF writer for tests (also used by forward.rs) -----------------------------------

pub(crate) fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

struct TensorSpec {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
    /// Overrides the offset the writer would choose.
    offset: Option<u64>,
}

pub(crate) struct Writer {
    version: u32,
    alignment: u64,
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<TensorSpec>,
}

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer {
            version: 3,
            alignment: 32,
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        }
    }

    /// A raw entry: key, value type id, encoded value.
    pub(crate) fn kv(mut self, key: &str, type_id: u32, value: &[u8]) -> Writer {
        self.kv.extend(gstr(key));
        self.kv.extend(type_id.to_le_bytes());
        self.kv.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    fn alignment(mut self, a: u32) -> Writer {
        self.alignment = a.into();
        self.kv("general.alignment", 4, &a.to_le_bytes())
    }

    pub(crate) fn tensor(
        mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Writer {
        self.tensors.push(TensorSpec {
            name: name.into(),
            dims: dims.into(),
            type_id: ty.id(),
            data,
            offset: None,
        });
        self
    }

    fn raw_tensor(mut self, spec: TensorSpec) -> Writer {
        self.tensors.push(spec);
        self
    }

    /// The file: no padding after the last tensor's data, so every proper prefix of a file
    /// whose last tensor has data is truncated.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let a = self.alignment.max(1);
        let mut offsets = Vec::new();
        let mut at = 0u64;
        for t in &self.tensors {
            offsets.push(t.offset.unwrap_or(at));
            at = (at + t.data.len() as u64).div_ceil(a) * a;
        }
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        for (t, off) in self.tensors.iter().zip(&offsets) {
            out.extend(gstr(&t.name));
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend(off.to_le_bytes());
        }
        let data_start = (out.len() as u64).div_ceil(a) * a;
        for (t, off) in self.tensors.iter().zip(&offsets) {
            if t.offset.is_some() {
                continue; // placed by hand: its bytes are not written
            }
            let start = (data_start + off) as usize;
            out.resize(start, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An array value: element type, count, encoded elements.
pub(crate) fn array(elem: u32, count: u64, elems: &[u8]) -> Vec<u8> {
    let mut v = elem.to_le_bytes().to_vec();
    v.extend(count.to_le_bytes());
    v.extend_from_slice(elems);
    v
}

/// A small file with every metadata type, arrays of every type (and nested), and three
/// tensors (F32, Q8_0, F16) with data.
fn every_type() -> Writer {
    let strings: Vec<u8> = ["a", "", "ünï"].iter().flat_map(|s| gstr(s)).collect();
    let nested = [
        array(4, 2, &[1, 0, 0, 0, 2, 0, 0, 0]),
        array(8, 1, &gstr("x")),
    ]
    .concat();
    let mut q8 = vec![0u8; 34];
    q8[..2].copy_from_slice(&0x3800u16.to_le_bytes()); // d = 0.5
    for (i, q) in q8[2..].iter_mut().enumerate() {
        *q = (i as i8 - 16) as u8;
    }
    Writer::new()
        .kv("u8", 0, &[200])
        .kv("i8", 1, &[0x80])
        .kv("u16", 2, &60000u16.to_le_bytes())
        .kv("i16", 3, &(-30000i16).to_le_bytes())
        .kv("u32", 4, &4_000_000_000u32.to_le_bytes())
        .kv("i32", 5, &(-2_000_000_000i32).to_le_bytes())
        .kv("f32", 6, &1.5f32.to_le_bytes())
        .kv("bool", 7, &[1])
        .kv("string", 8, &gstr("hello, GGUF"))
        .kv("u64", 10, &u64::MAX.to_le_bytes())
        .kv("i64", 11, &i64::MIN.to_le_bytes())
        .kv("f64", 12, &(-0.25f64).to_le_bytes())
        .kv("arr.u8", 9, &array(0, 3, &[1, 2, 3]))
        .kv("arr.i8", 9, &array(1, 2, &[0xff, 0x7f]))
        .kv("arr.u16", 9, &array(2, 1, &7u16.to_le_bytes()))
        .kv("arr.i16", 9, &array(3, 1, &(-7i16).to_le_bytes()))
        .kv("arr.u32", 9, &array(4, 2, &[9, 0, 0, 0, 10, 0, 0, 0]))
        .kv("arr.i32", 9, &array(5, 1, &(-9i32).to_le_bytes()))
        .kv("arr.f32", 9, &array(6, 2, &f32_bytes(&[0.5, -2.0])))
        .kv("arr.bool", 9, &array(7, 3, &[1, 0, 1]))
        .kv("arr.string", 9, &array(8, 3, &strings))
        .kv("arr.array", 9, &array(9, 2, &nested))
        .kv("arr.u64", 9, &array(10, 1, &5u64.to_le_bytes()))
        .kv("arr.i64", 9, &array(11, 1, &(-5i64).to_le_bytes()))
        .kv("arr.f64", 9, &array(12, 1, &2.5f64.to_le_bytes()))
        .kv("arr.empty", 9, &array(8, 0, &[]))
        .tensor(
            "norm.weight",
            &[4],
            GgmlType::F32,
            f32_bytes(&[1.0, -1.0, 0.5, 2.0]),
        )
        .tensor("blk.0.w", &[32, 1], GgmlType::Q8_0, q8)
        .tensor(
            "half",
            &[2, 1, 1, 1],
            GgmlType::F16,
            [0x00, 0x3c, 0x00, 0xc0].to_vec(),
        )
}

fn parse(bytes: &[u8]) -> Result<Gguf, den_model::GgufError> {
    Gguf::parse("t.gguf", bytes)
}

fn kind(bytes: &[u8]) -> ErrorKind {
    parse(bytes).expect_err("parse should fail").kind
}

// --- reading -------------------------------------------------------------------------------

#[test]
fn reads_every_metadata_type() {
    let f = GgufFile::from_bytes("t.gguf", every_type().bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), 26);
    assert_eq!(f.get_u32("u8").unwrap(), 200);
    assert_eq!(f.get("i8"), Some(&Value::I8(-128)));
    assert_eq!(f.get_u32("u16").unwrap(), 60000);
    assert_eq!(f.get_i32("i16").unwrap(), -30000);
    assert_eq!(f.get_u32("u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i64("i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_f32("f32").unwrap(), 1.5);
    assert!(f.get_bool("bool").unwrap());
    assert_eq!(f.get_str("string").unwrap(), "hello, GGUF");
    assert_eq!(f.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("i64").unwrap(), i64::MIN);
    assert_eq!(f.get_f64("f64").unwrap(), -0.25);
    assert_eq!(
        f.get("arr.u8"),
        Some(&Value::Array(Array::U8(vec![1, 2, 3])))
    );
    assert_eq!(
        f.get("arr.i8"),
        Some(&Value::Array(Array::I8(vec![-1, 127])))
    );
    assert_eq!(f.get("arr.u16"), Some(&Value::Array(Array::U16(vec![7]))));
    assert_eq!(f.get("arr.i16"), Some(&Value::Array(Array::I16(vec![-7]))));
    assert_eq!(f.get_u32_array("arr.u32").unwrap(), &[9, 10]);
    assert_eq!(f.get_i32_array("arr.i32").unwrap(), &[-9]);
    assert_eq!(f.get_f32_array("arr.f32").unwrap(), &[0.5, -2.0]);
    assert_eq!(
        f.get("arr.bool"),
        Some(&Value::Array(Array::Bool(vec![true, false, true])))
    );
    assert_eq!(f.get_str_array("arr.string").unwrap(), &["a", "", "ünï"]);
    assert_eq!(
        f.get_array("arr.array").unwrap(),
        &Array::Array(vec![
            Array::U32(vec![1, 2]),
            Array::String(vec!["x".into()])
        ])
    );
    assert_eq!(f.get("arr.u64"), Some(&Value::Array(Array::U64(vec![5]))));
    assert_eq!(f.get("arr.i64"), Some(&Value::Array(Array::I64(vec![-5]))));
    assert_eq!(f.get("arr.f64"), Some(&Value::Array(Array::F64(vec![2.5]))));
    assert!(f.get_str_array("arr.empty").unwrap().is_empty());
    // File order is kept.
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k).take(3).collect();
    assert_eq!(keys, ["u8", "i8", "u16"]);
    assert_eq!(f.get("f32").map(Value::value_type), Some(ValueType::F32));
}

#[test]
fn typed_accessors_refuse_with_one_line() {
    let f = GgufFile::from_bytes("t.gguf", every_type().bytes()).unwrap();
    let e = f.get_u32("llama.block_count").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.gguf: missing metadata key \"llama.block_count\""
    );
    let e = f.get_u32("i8").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.gguf: metadata \"i8\" is i8 -128, expected a u32"
    );
    let e = f.get_str("u32").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.gguf: metadata \"u32\" is u32 4000000000, expected a string"
    );
    let e = f.get_str_array("arr.u32").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.gguf: metadata \"arr.u32\" is array of 2 u32, expected an array of string"
    );
    assert!(f.get_f32("f64").is_err());
    assert!(f.get_i32("u32").is_err());
}

#[test]
fn tensors_are_views_of_the_bytes() {
    let bytes = every_type().bytes();
    let f = GgufFile::from_bytes("t.gguf", bytes.clone()).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    let norm = f.tensor("norm.weight").unwrap();
    assert_eq!(norm.ggml_type(), GgmlType::F32);
    assert_eq!(norm.dims(), &[4]);
    assert_eq!(norm.info().offset(), 0);
    assert_eq!(norm.info().file_offset(), f.data_offset());
    assert_eq!(norm.dequantize().unwrap(), [1.0, -1.0, 0.5, 2.0]);
    // The view points into the file's bytes.
    let start = norm.info().file_offset() as usize;
    assert_eq!(norm.data(), &bytes[start..start + 16]);
    assert!(std::ptr::eq(
        norm.data().as_ptr(),
        f.bytes()[start..].as_ptr()
    ));

    let q = f.tensor("blk.0.w").unwrap();
    assert_eq!(q.info().offset(), 32);
    assert_eq!((q.ne0(), q.rows(), q.n_elements()), (32, 1, 32));
    let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
    assert_eq!(q.dequantize().unwrap(), want);
    let mut row = vec![0.0; 32];
    q.dequantize_row(0, &mut row).unwrap();
    assert_eq!(row, want);
    let e = q.dequantize_row(1, &mut row).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.gguf: tensor \"blk.0.w\" (Q8_0): Q8_0: row 1 is past the end (1 rows of 32 elements)"
    );
    assert_eq!(q.row(0).map(<[u8]>::len), Some(34));
    assert_eq!(q.row(1), None);

    let h = f.tensor("half").unwrap();
    assert_eq!(h.dims(), &[2, 1, 1, 1]);
    assert_eq!(h.dequantize().unwrap(), [1.0, -2.0]);

    let names: Vec<&str> = f.tensor_views().map(|t| t.name()).collect();
    assert_eq!(names, ["norm.weight", "blk.0.w", "half"]);
    let e = f.tensor("nope").unwrap_err();
    assert_eq!(e.to_string(), "t.gguf: no tensor named \"nope\"");
}

#[test]
fn honours_general_alignment() {
    for a in [1u32, 8, 64, 4096] {
        let w = Writer::new()
            .alignment(a)
            .kv("name", 8, &gstr("x"))
            .tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
            .tensor("b", &[1], GgmlType::F32, f32_bytes(&[4.0]));
        let f = GgufFile::from_bytes("t.gguf", w.bytes()).unwrap();
        assert_eq!(f.alignment(), a);
        assert_eq!(f.data_offset() % u64::from(a), 0, "alignment {a}");
        let b = f.tensor("b").unwrap();
        assert_eq!(b.info().offset(), 12u64.div_ceil(a.into()) * u64::from(a));
        assert_eq!(b.dequantize().unwrap(), [4.0]);
        assert_eq!(
            f.tensor("a").unwrap().dequantize().unwrap(),
            [1.0, 2.0, 3.0]
        );
    }
}

#[test]
fn version_2_reads_and_an_empty_file_is_fine() {
    let mut w = every_type();
    w.version = 2;
    assert_eq!(parse(&w.bytes()).unwrap().version(), 2);
    let empty = Writer::new().bytes();
    let g = parse(&empty).unwrap();
    assert_eq!((g.metadata().len(), g.tensors().len()), (0, 0));
    assert_eq!(g.data_offset(), 32);
}

#[test]
fn open_maps_a_file() {
    let path = std::env::temp_dir().join(format!("den-model-test-{}.gguf", std::process::id()));
    std::fs::write(&path, every_type().bytes()).unwrap();
    let f = GgufFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    let f = f.unwrap();
    assert_eq!(f.name(), path.display().to_string());
    assert_eq!(f.tensor("half").unwrap().dequantize().unwrap(), [1.0, -2.0]);

    let missing = std::env::temp_dir().join("den-model-test-does-not-exist.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Io(_)));
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("{}: ", missing.display())),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
}

// --- errors ----------------------------------------------------------------------------------

#[test]
fn every_prefix_is_an_error_never_a_panic() {
    let bytes = every_type().bytes();
    assert!(parse(&bytes).is_ok());
    for n in 0..bytes.len() {
        let e = match parse(&bytes[..n]) {
            Ok(_) => panic!("a {n}-byte prefix of {} parsed", bytes.len()),
            Err(e) => e,
        };
        let msg = e.to_string();
        assert!(msg.starts_with("t.gguf: "), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        assert!(
            matches!(
                e.kind,
                ErrorKind::Truncated { .. }
                    | ErrorKind::CountTooLarge { .. }
                    | ErrorKind::DataOutOfBounds { .. }
            ),
            "prefix {n}: {msg}"
        );
    }
}

#[test]
fn truncation_messages_say_where() {
    let bytes = every_type().bytes();
    assert_eq!(
        parse(&bytes[..10]).unwrap_err().to_string(),
        "t.gguf: truncated: the header ends at byte 16 but the file has 10 bytes"
    );
    let half_offset = parse(&bytes).unwrap().tensor_info("half").unwrap().offset();
    assert_eq!(half_offset, 96);
    let last = bytes.len() - 1;
    assert_eq!(
        parse(&bytes[..last]).unwrap_err().to_string(),
        format!(
            "t.gguf: tensor \"half\": its 4 bytes at data offset 96 end at byte {} but the file has {last} bytes",
            last + 1
        )
    );
}

#[test]
fn every_single_byte_corruption_is_ok_or_an_error() {
    let bytes = every_type().bytes();
    let mut parsed = 0;
    for i in 0..bytes.len() {
        for v in [
            0u8,
            0xff,
            bytes[i] ^ 1,
            bytes[i] ^ 0x80,
            bytes[i].wrapping_add(9),
        ] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok(f) = GgufFile::from_bytes("t.gguf", b) {
                parsed += 1;
                for t in f.tensor_views() {
                    let _ = t.dequantize();
                }
                let _ = weights_digest(&f);
            }
        }
    }
    assert!(parsed > 0);
}

#[test]
fn bad_magic_and_versions() {
    let mut b = every_type().bytes();
    b[..4].copy_from_slice(b"GGML");
    assert_eq!(
        parse(&b).unwrap_err().to_string(),
        "t.gguf: not a GGUF file: it starts with \"GGML\", not \"GGUF\""
    );
    b[..4].copy_from_slice(&[0x7f, b'E', b'L', b'F']);
    assert_eq!(
        parse(&b).unwrap_err().to_string(),
        "t.gguf: not a GGUF file: it starts with \"\\x7fELF\", not \"GGUF\""
    );
    for (v, want) in [
        (1u32, "unsupported GGUF version 1 (supported: 2 and 3)"),
        (4, "unsupported GGUF version 4 (supported: 2 and 3)"),
        (
            3u32.swap_bytes(),
            "big-endian GGUF (version 3 byte-swapped) is not supported",
        ),
    ] {
        let mut w = every_type();
        w.version = v;
        assert_eq!(kind(&w.bytes()).to_string(), want);
    }
}

#[test]
fn unknown_types_are_errors() {
    let w = Writer::new().raw_tensor(TensorSpec {
        name: "w".into(),
        dims: vec![32],
        type_id: 4, // Q4_2, removed from ggml
        data: vec![0; 18],
        offset: None,
    });
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "tensor \"w\" has unknown ggml type 4"
    );
    let w = Writer::new().kv("k", 13, &[0; 8]);
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "the value of metadata \"k\": unknown metadata value type 13"
    );
    let w = Writer::new().kv("k", 9, &array(99, 0, &[]));
    assert!(matches!(
        kind(&w.bytes()),
        ErrorKind::BadValueType { id: 99, .. }
    ));
}

#[test]
fn tensor_data_past_the_end_is_an_error() {
    let w = Writer::new()
        .tensor("a", &[1], GgmlType::F32, f32_bytes(&[1.0]))
        .raw_tensor(TensorSpec {
            name: "far".into(),
            dims: vec![8],
            type_id: 0,
            data: Vec::new(),
            offset: Some(1 << 40),
        });
    assert!(matches!(
        kind(&w.bytes()),
        ErrorKind::DataOutOfBounds { ref name, offset, .. } if name == "far" && offset == 1 << 40
    ));
    // An offset near u64::MAX cannot wrap around.
    let w = Writer::new()
        .tensor("a", &[1], GgmlType::F32, f32_bytes(&[1.0]))
        .raw_tensor(TensorSpec {
            name: "wrap".into(),
            dims: vec![8],
            type_id: 0,
            data: Vec::new(),
            offset: Some(u64::MAX - 31),
        });
    assert!(matches!(
        kind(&w.bytes()),
        ErrorKind::DataOutOfBounds { .. }
    ));
}

#[test]
fn misaligned_offsets_are_errors() {
    let w = Writer::new()
        .tensor("a", &[1], GgmlType::F32, f32_bytes(&[1.0]))
        .raw_tensor(TensorSpec {
            name: "odd".into(),
            dims: vec![1],
            type_id: 0,
            data: Vec::new(),
            offset: Some(4),
        });
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "tensor \"odd\": offset 4 is not a multiple of the alignment 32"
    );
}

#[test]
fn shape_overflow_and_partial_blocks_are_errors() {
    for dims in [
        vec![u64::MAX, 2],
        vec![1 << 32, 1 << 32],
        vec![1 << 31, 1 << 31],
        vec![u64::MAX],
    ] {
        let w = Writer::new().raw_tensor(TensorSpec {
            name: "big".into(),
            dims: dims.clone(),
            type_id: 0,
            data: Vec::new(),
            offset: None,
        });
        match kind(&w.bytes()) {
            ErrorKind::BadShape {
                source: QuantError::ShapeOverflow { .. },
                ..
            } => {}
            other => panic!("{dims:?}: {other}"),
        }
    }
    let w = Writer::new().raw_tensor(TensorSpec {
        name: "q".into(),
        dims: vec![100, 2],
        type_id: GgmlType::Q4_K.id(),
        data: Vec::new(),
        offset: None,
    });
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "tensor \"q\": Q4_K shape [100, 2]: rows of 100 elements are not whole blocks of 256"
    );
    let w = Writer::new().raw_tensor(TensorSpec {
        name: "5d".into(),
        dims: vec![1; 5],
        type_id: 0,
        data: Vec::new(),
        offset: None,
    });
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "tensor \"5d\" has 5 dimensions, at most 4 are supported"
    );
}

#[test]
fn hostile_counts_do_not_allocate() {
    // A kv count of u64::MAX in a 24-byte file.
    let mut b = Writer::new().bytes();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    b.truncate(24);
    assert_eq!(
        kind(&b).to_string(),
        "the header: 18446744073709551615 metadata entries cannot fit in the 0 bytes that follow (each takes at least 13)"
    );
    // A tensor count of 2^40.
    let mut b = Writer::new().bytes();
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(kind(&b), ErrorKind::CountTooLarge { count, .. } if count == 1 << 40));
    // An array of 2^60 u64s, of strings, of arrays.
    for elem in [10u32, 8, 9] {
        let w = Writer::new().kv("k", 9, &array(elem, 1 << 60, &[0; 64]));
        assert!(matches!(kind(&w.bytes()), ErrorKind::CountTooLarge { .. }));
    }
    // A string of 2^63 bytes.
    let mut v = (1u64 << 63).to_le_bytes().to_vec();
    v.extend(b"abc");
    let w = Writer::new().kv("k", 8, &v);
    assert!(matches!(kind(&w.bytes()), ErrorKind::Truncated { .. }));
    // A key of u64::MAX bytes.
    let mut b = Writer::new().kv("k", 0, &[1]).bytes();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(kind(&b), ErrorKind::Truncated { .. }));
}

#[test]
fn deep_nesting_is_refused() {
    let mut v = array(4, 0, &[]);
    for _ in 0..MAX_ARRAY_DEPTH {
        v = array(9, 1, &v);
    }
    let w = Writer::new().kv("deep", 9, &v);
    assert!(matches!(kind(&w.bytes()), ErrorKind::TooDeep { .. }));
    // One level less is fine.
    let mut v = array(4, 0, &[]);
    for _ in 0..MAX_ARRAY_DEPTH - 1 {
        v = array(9, 1, &v);
    }
    assert!(parse(&Writer::new().kv("deep", 9, &v).bytes()).is_ok());
}

#[test]
fn other_invalid_values_are_errors() {
    let w = Writer::new().kv("b", 7, &[2]);
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "the value of metadata \"b\": a bool byte of 2, expected 0 or 1"
    );
    let w = Writer::new().kv("s", 8, &[2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe]);
    assert!(matches!(kind(&w.bytes()), ErrorKind::BadUtf8 { .. }));
    let w = Writer::new().kv("k", 0, &[1]).kv("k", 0, &[2]);
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "metadata key \"k\" appears twice"
    );
    let w = Writer::new()
        .tensor("t", &[1], GgmlType::F32, f32_bytes(&[1.0]))
        .tensor("t", &[1], GgmlType::F32, f32_bytes(&[2.0]));
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "tensor name \"t\" appears twice"
    );
    for (ty, v) in [
        (4u32, 0u32.to_le_bytes().to_vec()),
        (4, 48u32.to_le_bytes().to_vec()),
    ] {
        let w = Writer::new().kv("general.alignment", ty, &v);
        assert!(matches!(kind(&w.bytes()), ErrorKind::BadAlignment(_)));
    }
    let w = Writer::new().kv("general.alignment", 10, &32u64.to_le_bytes());
    assert_eq!(
        kind(&w.bytes()).to_string(),
        "general.alignment must be a u32 power of two, found u64 32"
    );
    // Names with newlines stay on one line in messages.
    let w = Writer::new().kv("a\nb", 7, &[3]);
    let msg = parse(&w.bytes()).unwrap_err().to_string();
    assert_eq!(
        msg,
        "t.gguf: the value of metadata \"a\\nb\": a bool byte of 3, expected 0 or 1"
    );
}

#[test]
fn unsupported_types_read_but_do_not_dequantize() {
    let w = Writer::new().tensor("q51", &[32], GgmlType::Q5_1, vec![0; 24]);
    let f = GgufFile::from_bytes("t.gguf", w.bytes()).unwrap();
    let t = f.tensor("q51").unwrap();
    assert_eq!(t.data().len(), 24);
    assert_eq!(
        t.dequantize().unwrap_err().to_string(),
        "t.gguf: tensor \"q51\" (Q5_1): dequantizing Q5_1 is not supported"
    );
}

// --- fingerprint ----------------------------------------------------------------------------

#[test]
fn weights_digest_covers_table_and_data_only() {
    let digest = |w: &Writer| weights_digest(&GgufFile::from_bytes("t.gguf", w.bytes()).unwrap());
    let base = every_type();
    let d0 = digest(&base);
    // Metadata and alignment are not covered.
    assert_eq!(digest(&every_type().kv("extra", 0, &[1])), d0);
    assert_eq!(digest(&every_type().alignment(256)), d0);
    // Data, names, shapes, types are.
    let mut w = every_type();
    w.tensors[1].data[5] ^= 1;
    assert_ne!(digest(&w), d0);
    let mut w = every_type();
    w.tensors[0].name = "norm.weigh7".into();
    assert_ne!(digest(&w), d0);
    let mut w = every_type();
    w.tensors[2].dims = vec![2, 1];
    assert_ne!(digest(&w), d0);
    let mut w = every_type();
    w.tensors[2].type_id = GgmlType::BF16.id();
    assert_ne!(digest(&w), d0);
}
