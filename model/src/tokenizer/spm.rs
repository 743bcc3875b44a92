//! BPE merges that reproduce a SentencePiece-BPE vocabulary with scores (Gemma's GGUF):
//! llama.cpp's SPM tokenizer repeatedly joins the adjacent pair whose concatenation is the
//! highest-scoring token; a BPE whose merges are every split of every token into two
//! tokens, ranked by the joined token's score (highest first), makes the same choices.
//! The order is Hugging Face's converter's (`generate_merges`, which wrote Gemma's
//! `tokenizer.json`): tokens in id order, each token's splits by (left id, right id), then
//! a stable sort by (score, left length, right length in chars), highest first. For
//! Gemma 3 the merges that make normal tokens equal that file's, in order
//! (`tests/it/tokenizer.rs`); the rest make its user-defined whitespace runs, which the
//! GGUF spells with spaces where the file has `▁`, and which llama.cpp matches before the
//! merges run anyway.

use std::collections::HashMap;

/// The merges for the tokens `texts` (by id) with `scores` (by id), highest first.
pub fn sentencepiece_merges(texts: &[String], scores: &[f32]) -> Vec<(String, String)> {
    // text -> id; the last of duplicate texts wins, as in llama.cpp's token_to_id.
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(texts.len());
    for (id, t) in texts.iter().enumerate() {
        index.insert(t.as_str(), id);
    }
    // (score, left chars, right chars, left id, right id) per merge, grouped by the joined
    // token in id order.
    let mut merges: Vec<(f32, usize, usize, usize, usize)> = Vec::new();
    let mut local: Vec<(usize, usize, usize)> = Vec::new();
    for (id, text) in texts.iter().enumerate() {
        // Only the id that owns this text joins (a duplicate's earlier ids are unreachable).
        if index.get(text.as_str()) != Some(&id) {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(f32::NEG_INFINITY);
        local.clear();
        let n_chars = text.chars().count();
        for (left_chars, (split, _)) in text.char_indices().enumerate().skip(1) {
            let (l, r) = text.split_at(split);
            if let Some(&li) = index.get(l)
                && let Some(&ri) = index.get(r)
            {
                local.push((li, ri, left_chars));
            }
        }
        local.sort_unstable();
        merges.extend(
            local
                .iter()
                .map(|&(l, r, lc)| (score, lc, n_chars - lc, l, r)),
        );
    }
    // Stable: equal keys keep the order above (scores in f32's total order).
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
    merges
        .into_iter()
        .filter_map(|(_, _, _, l, r)| Some((texts.get(l)?.clone(), texts.get(r)?.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_rank_by_the_joined_tokens_score() {
        let texts: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .map(String::from)
            .to_vec();
        let scores = [0.0, 0.0, 0.0, -1.0, -0.5, -2.0];
        let m = sentencepiece_merges(&texts, &scores);
        let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, vec![("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
    }
}
