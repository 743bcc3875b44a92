//! GPT-2's byte-level alphabet: each of the 256 bytes stands for one printable char, so a
//! byte-level BPE vocabulary is text. The printable ASCII and Latin-1 bytes stand for
//! themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD) map to U+0100.. in order.

/// Whether `b` stands for itself.
const fn printable(b: u8) -> bool {
    (b >= b'!' && b <= b'~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE
}

/// The 68 bytes that are shifted to U+0100 + i, in order.
const SHIFTED: [u8; 68] = {
    let mut t = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !printable(b as u8) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
};

/// The char that stands for byte `b`.
pub fn byte_to_char(b: u8) -> char {
    if printable(b) {
        return char::from(b);
    }
    let i = SHIFTED.iter().position(|&s| s == b).unwrap_or(0);
    char::from_u32(0x100 + i as u32).unwrap_or('\u{100}')
}

/// The byte that `c` stands for, if it is in the alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 0x100 {
        let b = u as u8;
        return printable(b).then_some(b);
    }
    SHIFTED.get((u - 0x100) as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "{b} collides");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(char_to_byte('€'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
