//! Metadata key/values: every GGUF value type, arrays (typed, nested), typed accessors.

use std::collections::HashMap;
use std::fmt;

use super::error::{At, ErrorKind};
use super::parse::{Parser, truncated};

/// GGUF's value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in the file (a string is at least its
    /// length, an array at least its element type and length).
    fn min_bytes(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array value: its elements share one type, kept unboxed.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// What the value is, for messages: "u32 7", "string", "array of 3 f32".
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type().name()),
            Value::String(_) => "string".to_owned(),
            Value::F32(v) => format!("f32 {v}"),
            Value::F64(v) => format!("f64 {v}"),
            Value::Bool(v) => format!("bool {v}"),
            other => match other.as_i128() {
                Some(v) => format!("{} {v}", other.value_type().name()),
                None => other.value_type().name().to_owned(),
            },
        }
    }
}

impl Array {
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => write!(f, "{s:?}"),
            other => f.write_str(&other.describe()),
        }
    }
}

/// Why a typed accessor refused (the file-level accessors add the file's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetaError {
    #[error("missing metadata key {0:?}")]
    Missing(String),
    #[error("metadata {key:?} is {found}, expected {expected}")]
    WrongType {
        key: String,
        found: String,
        expected: &'static str,
    },
}

impl From<MetaError> for ErrorKind {
    fn from(e: MetaError) -> ErrorKind {
        match e {
            MetaError::Missing(key) => ErrorKind::MissingKey(key),
            MetaError::WrongType {
                key,
                found,
                expected,
            } => ErrorKind::WrongType {
                key,
                found,
                expected,
            },
        }
    }
}

/// The metadata, in file order, with unique keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! int_getter {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $expected:literal) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<$ty, MetaError> {
            let v = self.require(key)?;
            v.as_i128()
                .and_then(|n| <$ty>::try_from(n).ok())
                .ok_or_else(|| wrong(key, v, $expected))
        }
    };
}

macro_rules! array_getter {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $ty:ty, $expected:literal) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<&[$ty], MetaError> {
            match self.require(key)? {
                Value::Array(Array::$variant(v)) => Ok(v),
                v => Err(wrong(key, v, $expected)),
            }
        }
    };
}

fn wrong(key: &str, found: &Value, expected: &'static str) -> MetaError {
    MetaError::WrongType {
        key: key.to_owned(),
        found: found.describe(),
        expected,
    }
}

impl Metadata {
    /// Adds an entry; `Err` gives it back when the key is already there.
    pub(crate) fn insert(&mut self, key: String, value: Value) -> Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(key);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index
            .get(key)
            .and_then(|&i| self.entries.get(i))
            .map(|(_, v)| v)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&Value, MetaError> {
        self.get(key)
            .ok_or_else(|| MetaError::Missing(key.to_owned()))
    }

    int_getter!(
        /// An integer of any GGUF integer type whose value fits a u32 (converters differ in
        /// which integer type they write; the value is what matters).
        get_u32, u32, "a u32"
    );
    int_getter!(
        /// An integer of any GGUF integer type whose value fits a u64.
        get_u64, u64, "a u64"
    );
    int_getter!(
        /// An integer of any GGUF integer type whose value fits an i32.
        get_i32, i32, "an i32"
    );
    int_getter!(
        /// An integer of any GGUF integer type whose value fits an i64.
        get_i64, i64, "an i64"
    );

    /// An f32 (only an f32: widening or narrowing floats would hide a converter's choice).
    pub fn get_f32(&self, key: &str) -> Result<f32, MetaError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            v => Err(wrong(key, v, "an f32")),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, MetaError> {
        match self.require(key)? {
            Value::F64(v) => Ok(*v),
            v => Err(wrong(key, v, "an f64")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, MetaError> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            v => Err(wrong(key, v, "a bool")),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, MetaError> {
        match self.require(key)? {
            Value::String(v) => Ok(v),
            v => Err(wrong(key, v, "a string")),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, MetaError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(wrong(key, v, "an array")),
        }
    }

    array_getter!(get_str_array, String, String, "an array of string");
    array_getter!(get_f32_array, F32, f32, "an array of f32");
    array_getter!(get_i32_array, I32, i32, "an array of i32");
    array_getter!(get_u32_array, U32, u32, "an array of u32");
}

/// Nested arrays deeper than this are refused (bounded recursion on hostile input).
pub const MAX_ARRAY_DEPTH: usize = 8;

impl Parser<'_> {
    /// A value of type `id`; `at` says where, for errors.
    pub(crate) fn value(&mut self, id: u32, at: At<'_>) -> Result<Value, ErrorKind> {
        let ty = ValueType::from_id(id).ok_or_else(|| ErrorKind::BadValueType {
            what: at.to_string(),
            id,
        })?;
        let len = self.r.len();
        let short = |s| truncated(s, len, at);
        let r = &mut self.r;
        Ok(match ty {
            ValueType::U8 => Value::U8(r.u8().map_err(short)?),
            ValueType::I8 => Value::I8(r.u8().map_err(short)? as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(r.array().map_err(short)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(r.array().map_err(short)?)),
            ValueType::U32 => Value::U32(r.u32().map_err(short)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(r.array().map_err(short)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(r.array().map_err(short)?)),
            ValueType::U64 => Value::U64(r.u64().map_err(short)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(r.array().map_err(short)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(r.array().map_err(short)?)),
            ValueType::Bool => {
                let byte = r.u8().map_err(short)?;
                Value::Bool(bool_of(byte, at)?)
            }
            ValueType::String => Value::String(self.string(at)?),
            ValueType::Array => Value::Array(self.array(at, 1)?),
        })
    }

    /// An array (element type, count, elements), at nesting `depth` (1 = outermost).
    fn array(&mut self, at: At<'_>, depth: usize) -> Result<Array, ErrorKind> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(ErrorKind::TooDeep {
                what: at.to_string(),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let id = self.r.u32().map_err(|s| self.truncated(s, at))?;
        let ty = ValueType::from_id(id).ok_or_else(|| ErrorKind::BadValueType {
            what: at.to_string(),
            id,
        })?;
        let count = self.r.u64().map_err(|s| self.truncated(s, at))?;
        let n = self.count(count, ty.min_bytes(), "array elements", at)?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let bytes = self
                    .r
                    .take((n * size_of::<$t>()) as u64)
                    .map_err(|s| self.truncated(s, at))?;
                Array::$variant(
                    bytes
                        .as_chunks::<{ size_of::<$t>() }>()
                        .0
                        .iter()
                        .map(|b| <$t>::from_le_bytes(*b))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let bytes = self.r.take(n as u64).map_err(|s| self.truncated(s, at))?;
                Array::Bool(
                    bytes
                        .iter()
                        .map(|&b| bool_of(b, at))
                        .collect::<Result<_, _>>()?,
                )
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(at)?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(at, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

fn bool_of(byte: u8, at: At<'_>) -> Result<bool, ErrorKind> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ErrorKind::BadBool {
            what: at.to_string(),
            byte,
        }),
    }
}
