//! Finding snapshots in a zstd recording without decompressing it: walk the frame and
//! block headers (RFC 8878) and read den's skippable marker frames, which precede the
//! frame of each snapshot and hold `{"at":N,"snapshot":K}`.

use std::io::{self, BufRead, BufReader, Read, Seek};

use den_protocol::recording::{Kind, peek};
use den_protocol::time::Millis;

use crate::record::SKIPPABLE_MAGIC;

const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// A snapshot's marker frame: decompression that starts at `offset` begins with the
/// snapshot line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub offset: u64,
    pub at: Millis,
    pub events: u64,
}

/// What the walk found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frames {
    pub markers: Vec<Marker>,
    /// The file ends inside a frame (a crash while writing).
    pub truncated: bool,
}

/// Walk every frame of a zstd file.
pub fn walk(file: &std::fs::File) -> io::Result<Frames> {
    let mut r = BufReader::with_capacity(256 * 1024, file);
    r.rewind()?;
    let mut frames = Frames::default();
    let mut offset: u64 = 0;
    loop {
        let mut magic = [0u8; 4];
        match read_exact_or_eof(&mut r, &mut magic)? {
            0 => return Ok(frames),
            4 => {}
            _ => {
                frames.truncated = true;
                return Ok(frames);
            }
        }
        let magic = u32::from_le_bytes(magic);
        if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
            let mut size = [0u8; 4];
            if read_exact_or_eof(&mut r, &mut size)? < 4 {
                frames.truncated = true;
                return Ok(frames);
            }
            let size = u32::from_le_bytes(size);
            if magic == SKIPPABLE_MAGIC && size <= 256 {
                let mut body = vec![0u8; size as usize];
                if read_exact_or_eof(&mut r, &mut body)? < body.len() {
                    frames.truncated = true;
                    return Ok(frames);
                }
                if let Some(p) = peek(&body)
                    && let Kind::Snapshot { events } = p.kind
                {
                    frames.markers.push(Marker {
                        offset,
                        at: p.at,
                        events,
                    });
                }
            } else {
                r.seek_relative(i64::from(size))?;
            }
            offset += 8 + u64::from(size);
            continue;
        }
        if magic != ZSTD_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a zstd stream at byte {offset}"),
            ));
        }
        let mut len = 4u64;
        let mut fhd = [0u8; 1];
        if read_exact_or_eof(&mut r, &mut fhd)? < 1 {
            frames.truncated = true;
            return Ok(frames);
        }
        len += 1;
        let fhd = fhd[0];
        let single_segment = fhd & 0x20 != 0;
        let checksum = fhd & 0x04 != 0;
        let dict_len = [0u64, 1, 2, 4][usize::from(fhd & 0x03)];
        let fcs_len = match fhd >> 6 {
            0 => u64::from(single_segment),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let window_len = u64::from(!single_segment);
        let skip = window_len + dict_len + fcs_len;
        r.seek_relative(skip as i64)?;
        len += skip;
        loop {
            let mut header = [0u8; 3];
            if read_exact_or_eof(&mut r, &mut header)? < 3 {
                frames.truncated = true;
                return Ok(frames);
            }
            len += 3;
            let h = u32::from(header[0]) | u32::from(header[1]) << 8 | u32::from(header[2]) << 16;
            let last = h & 1 != 0;
            let kind = (h >> 1) & 3;
            let size = u64::from(h >> 3);
            let content = match kind {
                0 | 2 => size,
                1 => 1,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("reserved zstd block type at byte {}", offset + len),
                    ));
                }
            };
            if !skip_exact(&mut r, content)? {
                frames.truncated = true;
                return Ok(frames);
            }
            len += content;
            if last {
                break;
            }
        }
        if checksum {
            if !skip_exact(&mut r, 4)? {
                frames.truncated = true;
                return Ok(frames);
            }
            len += 4;
        }
        offset += len;
    }
}

/// Read up to `buf.len()` bytes; fewer only at the end of the file.
fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Skip `n` bytes; false when the file ends first.
fn skip_exact<R: BufRead + Seek>(r: &mut R, n: u64) -> io::Result<bool> {
    let mut left = n;
    while left > 0 {
        let available = r.fill_buf()?.len() as u64;
        if available == 0 {
            return Ok(false);
        }
        let step = available.min(left);
        r.consume(step as usize);
        left -= step;
    }
    Ok(true)
}
