//! A bounds-checked little-endian cursor over the file's bytes.

/// A read that would run past the end: it would have ended at byte `end`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Short {
    pub end: u128,
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: u64) -> Result<&'a [u8], Short> {
        let short = Short {
            end: self.pos as u128 + u128::from(n),
        };
        let n = usize::try_from(n).map_err(|_| short)?;
        let end = self.pos.checked_add(n).ok_or(short)?;
        let bytes = self.buf.get(self.pos..end).ok_or(short)?;
        self.pos = end;
        Ok(bytes)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let short = Short {
            end: self.pos as u128 + N as u128,
        };
        let rest = self.buf.get(self.pos..).ok_or(short)?;
        let (head, _) = rest.split_first_chunk::<N>().ok_or(short)?;
        self.pos += N;
        Ok(*head)
    }

    pub fn u8(&mut self) -> Result<u8, Short> {
        self.array::<1>().map(|[b]| b)
    }

    pub fn u32(&mut self) -> Result<u32, Short> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Result<u64, Short> {
        self.array().map(u64::from_le_bytes)
    }
}
