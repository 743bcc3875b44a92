//! Where lines go: a plain file or a zstd stream, flushed after every line.
//!
//! zstd: every flush ends a block, so a crash leaves complete blocks and loses at most
//! the line being written. Each snapshot starts a new zstd frame, preceded by a
//! skippable frame holding `{"at":N,"snapshot":K}` (ignored by every zstd decoder): the
//! replayer finds snapshots by walking frame headers without decompressing, and starts
//! decompressing at the frame of the snapshot it needs.

use std::fs::File;
use std::io::{self, BufWriter, Write};

/// First magic number of zstd skippable frames (`0x184D2A50`–`0x184D2A5F`); den uses
/// this one for its snapshot markers.
pub const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// zstd compression level of recordings.
const LEVEL: i32 = 3;

/// A writer that counts the bytes handed to the file.
pub struct Counting<W> {
    inner: W,
    pub written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

type Out = BufWriter<Counting<File>>;

pub enum Sink {
    Plain(Out),
    /// `None` only transiently while a frame is being finished.
    Zstd(Option<zstd::stream::write::Encoder<'static, Out>>),
}

impl Sink {
    pub fn open(file: File, compressed: bool) -> io::Result<Sink> {
        let out = BufWriter::with_capacity(
            64 * 1024,
            Counting {
                inner: file,
                written: 0,
            },
        );
        if compressed {
            Ok(Sink::Zstd(Some(zstd::stream::write::Encoder::new(
                out, LEVEL,
            )?)))
        } else {
            Ok(Sink::Plain(out))
        }
    }

    /// Write one line and its newline, and flush it to the file.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        match self {
            Sink::Plain(out) => {
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")?;
                out.flush()
            }
            Sink::Zstd(Some(enc)) => {
                enc.write_all(line.as_bytes())?;
                enc.write_all(b"\n")?;
                enc.flush()
            }
            Sink::Zstd(None) => Err(closed()),
        }
    }

    /// Before a snapshot: end the zstd frame and write the snapshot's marker frame.
    pub fn new_frame(&mut self, marker: &str) -> io::Result<()> {
        let Sink::Zstd(slot) = self else {
            return Ok(());
        };
        let enc = slot.take().ok_or_else(closed)?;
        let mut out = enc.finish()?;
        let len = u32::try_from(marker.len()).map_err(|_| io::Error::other("marker too long"))?;
        out.write_all(&SKIPPABLE_MAGIC.to_le_bytes())?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(marker.as_bytes())?;
        *slot = Some(zstd::stream::write::Encoder::new(out, LEVEL)?);
        Ok(())
    }

    /// Bytes in the file so far (compressed for zstd).
    pub fn file_bytes(&self) -> u64 {
        match self {
            Sink::Plain(out) => out.get_ref().written + out.buffer().len() as u64,
            Sink::Zstd(Some(enc)) => {
                let out = enc.get_ref();
                out.get_ref().written + out.buffer().len() as u64
            }
            Sink::Zstd(None) => 0,
        }
    }

    /// Flush and fsync the data.
    pub fn sync(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(out) => {
                out.flush()?;
                out.get_ref().inner.sync_data()
            }
            Sink::Zstd(Some(enc)) => {
                enc.flush()?;
                enc.get_ref().get_ref().inner.sync_data()
            }
            Sink::Zstd(None) => Err(closed()),
        }
    }

    /// End the stream (the zstd frame) and fsync. Returns the file's size.
    pub fn finish(self) -> io::Result<u64> {
        let mut out = match self {
            Sink::Plain(out) => out,
            Sink::Zstd(Some(enc)) => enc.finish()?,
            Sink::Zstd(None) => return Err(closed()),
        };
        out.flush()?;
        out.get_ref().inner.sync_data()?;
        Ok(out.get_ref().written)
    }
}

fn closed() -> io::Error {
    io::Error::other("recording stream already finished")
}
