//! A GGUF file and its bytes: memory-mapped from disk, or owned (tests, fuzzing).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use super::error::{ErrorKind, GgufError};
use super::metadata::{Array, MetaError, Metadata, Value};
use super::parse::Gguf;
use super::tensor::{Tensor, TensorInfo};

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An open GGUF file: its parsed layout and its bytes. Tensor data are slices of the bytes,
/// never copies. Derefs to [`Gguf`] for the layout (version, metadata, tensor table).
pub struct GgufFile {
    name: String,
    bytes: Bytes,
    layout: Gguf,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("len", &self.bytes.as_slice().len())
            .field("version", &self.layout.version())
            .field("tensors", &self.layout.tensors().len())
            .finish_non_exhaustive()
    }
}

impl Deref for GgufFile {
    type Target = Gguf;

    fn deref(&self) -> &Gguf {
        &self.layout
    }
}

macro_rules! file_getter {
    ($(#[$doc:meta])* $name:ident -> $ty:ty) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<$ty, GgufError> {
            self.layout.metadata().$name(key).map_err(|e| self.meta_error(e))
        }
    };
}

impl GgufFile {
    /// Maps `path` read-only and parses it; the weights stay in the page cache, not the heap.
    ///
    /// The file must not be modified while open (a memory map sees writes, and a
    /// truncation turns reads into SIGBUS): model files are written once, then only read.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io = |e| GgufError::new(&name, ErrorKind::Io(e));
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value; the documented contract
        // is that model files are not modified while den has them open (see above).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let layout = Gguf::parse(&name, &map)?;
        Ok(GgufFile {
            name,
            bytes: Bytes::Mapped(map),
            layout,
        })
    }

    /// Parses bytes already in memory; `name` names them in errors.
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let name = name.into();
        let layout = Gguf::parse(&name, &bytes)?;
        Ok(GgufFile {
            name,
            bytes: Bytes::Owned(bytes),
            layout,
        })
    }

    /// The file's name as given (the path for [`GgufFile::open`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The parsed layout.
    pub fn layout(&self) -> &Gguf {
        &self.layout
    }

    fn meta_error(&self, e: MetaError) -> GgufError {
        GgufError::new(&self.name, e.into())
    }

    /// A tensor's bytes. `info` must come from this file's table (it does when taken from
    /// [`Gguf::tensors`]); anything else gets an empty slice.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        self.bytes().get(info.range()).unwrap_or_default()
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> Tensor<'a> {
        Tensor {
            file: &self.name,
            info,
            data: self.tensor_data(info),
        }
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>, GgufError> {
        self.layout
            .tensor_info(name)
            .map(|info| self.view(info))
            .ok_or_else(|| GgufError::new(&self.name, ErrorKind::NoTensor(name.to_owned())))
    }

    /// Every tensor, in file order.
    pub fn tensor_views(&self) -> impl Iterator<Item = Tensor<'_>> {
        self.layout.tensors().iter().map(|info| self.view(info))
    }

    /// A metadata value, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.layout.metadata().get(key)
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        self.layout.metadata()
    }

    file_getter!(
        /// See [`Metadata::get_u32`]: any integer type whose value fits.
        get_u32 -> u32
    );
    file_getter!(get_u64 -> u64);
    file_getter!(get_i32 -> i32);
    file_getter!(get_i64 -> i64);
    file_getter!(get_f32 -> f32);
    file_getter!(get_f64 -> f64);
    file_getter!(get_bool -> bool);
    file_getter!(get_str -> &str);
    file_getter!(get_array -> &Array);
    file_getter!(get_str_array -> &[String]);
    file_getter!(get_f32_array -> &[f32]);
    file_getter!(get_i32_array -> &[i32]);
    file_getter!(get_u32_array -> &[u32]);
}
