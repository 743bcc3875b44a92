//! Splitting text at special tokens before the model's tokenizer runs, as llama.cpp's
//! `tokenizer_st_partition` does: the control, unknown and user-defined tokens, longest
//! text first (ties: lower id first), each taking its leftmost non-overlapping
//! occurrences in the text that earlier (longer) ones left. Without `parse_special` only
//! the user-defined tokens are matched.
//!
//! llama.cpp scans the text once per special token (Gemma has 6,414); den first finds
//! which special tokens occur at all, in one Aho-Corasick pass that keeps only a bit per
//! token (memory stays bounded however many matches overlap), then runs llama.cpp's
//! partition for those alone. Token attributes `lstrip`/`rstrip` (llama.cpp sets them
//! for a few other models by name) are not modelled.

use aho_corasick::{AhoCorasick, MatchKind};

use super::vocab::{TokenKind, Vocab};

/// A piece of the text: raw text for the model's tokenizer, or a special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Raw(&'a str),
    Token(u32),
}

/// The special tokens' texts in match order.
#[derive(Debug, Clone)]
pub(crate) struct Specials {
    /// Patterns in priority order: pattern index = priority (0 first).
    matcher: Option<AhoCorasick>,
    texts: Vec<String>,
    ids: Vec<u32>,
    user_defined: Vec<bool>,
}

impl Specials {
    pub fn new(vocab: &Vocab) -> Result<Specials, String> {
        let mut ids: Vec<u32> = (0..vocab.len())
            .filter(|&i| {
                matches!(
                    vocab.kinds.get(i),
                    Some(TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown)
                ) && vocab.texts.get(i).is_some_and(|t| !t.is_empty())
            })
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        let text_of = |id: u32| vocab.texts.get(id as usize).map_or("", String::as_str);
        ids.sort_by(|&a, &b| text_of(b).len().cmp(&text_of(a).len()).then(a.cmp(&b)));
        let texts: Vec<String> = ids.iter().map(|&id| text_of(id).to_owned()).collect();
        let user_defined = ids
            .iter()
            .map(|&id| vocab.kind(id) == Some(TokenKind::UserDefined))
            .collect();
        let matcher = if ids.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::Standard)
                    .build(&texts)
                    .map_err(|e| format!("cannot index the special tokens: {e}"))?,
            )
        };
        Ok(Specials {
            matcher,
            texts,
            ids,
            user_defined,
        })
    }

    /// The number of special tokens matched when parsing special tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Splits `text` into fragments, in order; no fragment is empty.
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        // (start, end, token): a raw span when the token is None.
        let mut spans: Vec<(usize, usize, Option<u32>)> = Vec::new();
        if !text.is_empty() {
            spans.push((0, text.len(), None));
        }
        if let Some(matcher) = &self.matcher {
            // Which eligible patterns occur, as bits; then each in priority order.
            let mut present = vec![0u64; self.ids.len().div_ceil(64)];
            for m in matcher.find_overlapping_iter(text) {
                let p = m.pattern().as_usize();
                if let Some(word) = present.get_mut(p / 64) {
                    *word |= 1 << (p % 64);
                }
            }
            let occurring = (0..self.ids.len()).filter(|&p| {
                present
                    .get(p / 64)
                    .is_some_and(|w| w & (1 << (p % 64)) != 0)
                    && (parse_special || self.user_defined.get(p) == Some(&true))
            });
            let mut next = Vec::new();
            for p in occurring {
                let (Some(pat), Some(&id)) = (self.texts.get(p), self.ids.get(p)) else {
                    continue;
                };
                split_at_token(text, &spans, pat, id, &mut next);
                std::mem::swap(&mut spans, &mut next);
            }
        }
        spans
            .into_iter()
            .map(|(start, end, token)| match token {
                Some(id) => Fragment::Token(id),
                None => Fragment::Raw(text.get(start..end).unwrap_or_default()),
            })
            .collect()
    }
}

/// llama.cpp's step for one special token: each raw span's leftmost non-overlapping
/// occurrences of `pat` become the token; `out` gets the new span list.
fn split_at_token(
    text: &str,
    spans: &[(usize, usize, Option<u32>)],
    pat: &str,
    id: u32,
    out: &mut Vec<(usize, usize, Option<u32>)>,
) {
    out.clear();
    for &(start, end, token) in spans {
        if token.is_some() {
            out.push((start, end, token));
            continue;
        }
        let mut at = start;
        while let Some(i) = text.get(at..end).and_then(|raw| raw.find(pat)) {
            if i > 0 {
                out.push((at, at + i, None));
            }
            out.push((at + i, at + i + pat.len(), Some(id)));
            at += i + pat.len();
        }
        if at < end {
            out.push((at, end, None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::vocab::Spelling;
    use super::*;
    use Fragment::{Raw, Token};

    fn specials(entries: &[(&str, TokenKind)]) -> Specials {
        let texts = entries.iter().map(|e| e.0.to_owned()).collect();
        let kinds = entries.iter().map(|e| e.1).collect();
        Specials::new(&Vocab::new(texts, kinds, Spelling::SentencePiece)).unwrap()
    }

    #[test]
    fn longer_tokens_win_and_user_defined_ones_always_match() {
        use TokenKind::*;
        let s = specials(&[
            ("a", Normal),
            ("<s>", Control),
            ("\n", UserDefined),
            ("\n\n", UserDefined),
            ("<s><s>", Control),
            ("", Control),
        ]);
        assert_eq!(s.len(), 4);
        assert_eq!(
            s.partition("x<s>y\n\n\nz<s><s><s>", true),
            vec![
                Raw("x"),
                Token(1),
                Raw("y"),
                Token(3),
                Token(2),
                Raw("z"),
                Token(4),
                Token(1)
            ]
        );
        assert_eq!(s.partition("x<s>\n", false), vec![Raw("x<s>"), Token(2)]);
        assert_eq!(s.partition("", true), vec![]);
        assert_eq!(s.partition("<s>", true), vec![Token(1)]);
    }

    #[test]
    fn many_overlapping_matches_stay_cheap() {
        // Gemma-like newline runs of 1..=31: a long run of newlines overlaps them all.
        let runs: Vec<(String, TokenKind)> = (1..=31)
            .map(|n| ("\n".repeat(n), TokenKind::UserDefined))
            .collect();
        let entries: Vec<(&str, TokenKind)> = runs.iter().map(|(t, k)| (t.as_str(), *k)).collect();
        let s = specials(&entries);
        let text = "\n".repeat(3_000 * 31 + 2);
        let parts = s.partition(&text, false);
        assert_eq!(parts.len(), 3_001);
        assert_eq!(parts.first(), Some(&Token(30)));
        assert_eq!(parts.last(), Some(&Token(1)));
    }

    #[test]
    fn a_longer_token_blocks_an_overlapping_shorter_one() {
        use TokenKind::*;
        // "<ab>" is taken first; "b>c" overlaps it and must not match, the later "b>c" does.
        let s = specials(&[("<ab>", Control), ("b>c", Control)]);
        assert_eq!(
            s.partition("<ab>c b>c", true),
            vec![Token(0), Raw("c "), Token(1)]
        );
    }
}
