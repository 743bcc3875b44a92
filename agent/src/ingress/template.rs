//! The chat template: messages → prompt text → tokens.
//!
//! A ChatML-like rendering, fixed and documented so prompts (and therefore cached
//! prefixes) are stable:
//!
//! ```text
//! <|im_start|>{role}\n{content}<|im_end|>\n      (once per message, in order)
//! <|im_start|>assistant\n                         (the generation prompt)
//! ```
//!
//! Roles are written as given (`developer` stays `developer`). The text is tokenized by
//! the synthetic engine's deterministic word/byte tokenizer ([`crate::engine::tokenize`]),
//! which is no real model's tokenizer: the markers become byte tokens. Two conversations
//! that share their first messages share a token prefix, which is what prefix reuse needs.

use den_protocol::request::Token;

use super::parse::{Message, Prompt};
use crate::engine;

/// The prompt text for a conversation.
pub fn render(messages: &[Message]) -> String {
    let mut text = String::with_capacity(messages.iter().map(|m| m.content.len() + 32).sum());
    for m in messages {
        text.push_str("<|im_start|>");
        text.push_str(m.role.as_str());
        text.push('\n');
        text.push_str(&m.content);
        text.push_str("<|im_end|>\n");
    }
    text.push_str("<|im_start|>assistant\n");
    text
}

/// The prompt tokens for a conversation (never empty: the generation prompt is always
/// there).
pub fn chat_tokens(messages: &[Message]) -> Vec<Token> {
    engine::tokenize(&render(messages))
}

/// The prompt tokens for a completions prompt.
pub fn prompt_tokens(prompt: &Prompt) -> Vec<Token> {
    match prompt {
        Prompt::Text(s) => engine::tokenize(s),
        Prompt::Tokens(t) => t.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::parse::Role;

    fn msg(role: Role, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
        }
    }

    #[test]
    fn renders_chatml_and_shares_prefixes_between_turns() {
        let first = vec![msg(Role::System, "be brief"), msg(Role::User, "hello den")];
        assert_eq!(
            render(&first),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello den<|im_end|>\n<|im_start|>assistant\n"
        );
        let mut second = first.clone();
        second.push(msg(Role::Assistant, "the cache"));
        second.push(msg(Role::User, "and the page"));
        let a = chat_tokens(&first);
        let b = chat_tokens(&second);
        // Everything but the generation prompt is shared.
        let gen_prompt = engine::tokenize("<|im_start|>assistant\n").len();
        assert_eq!(a[..a.len() - gen_prompt], b[..a.len() - gen_prompt]);
        assert_eq!(engine::detokenize(&b), render(&second));
    }
}
