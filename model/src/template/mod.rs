//! Chat templates: a conversation to the prompt text the model was trained on.
//!
//! [`ChatTemplate::from_gguf`] takes the GGUF's `tokenizer.chat_template` (Jinja, rendered
//! with `minijinja` as Hugging Face renders it: `trim_blocks`, `lstrip_blocks`, Python's
//! string methods, `raise_exception`, with `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`). A GGUF without one (Gemma 3's) gets the hand-written format
//! its tokens name: Gemma's turns (`<start_of_turn>`) or ChatML (`<|im_start|>`). The
//! hand-written formats produce the same text as the models' own templates (SmolLM2's in
//! its GGUF, Gemma 3's in its `tokenizer_config.json`): `tests/it/template.rs`.
//!
//! A rendered prompt holds its BOS where the template writes one (Gemma's does): encode
//! it with `add_special = false` and `parse_special = true`.

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant` (Gemma's template calls the assistant `model`).
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// SmolLM2-Instruct's system prompt when a conversation has none (its template's).
pub const SMOLLM2_DEFAULT_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// A conversation could not be rendered, or a template could not be read: one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The Jinja template has a syntax error, or failed while rendering (its message,
    /// `raise_exception`'s included).
    #[error("chat template: {0}")]
    Jinja(String),
    /// The conversation breaks the format's rules (Gemma: roles must alternate).
    #[error("chat template: {0}")]
    Conversation(String),
    #[error(
        "{0}: no tokenizer.chat_template, and its vocabulary has neither <start_of_turn> nor <|im_start|>"
    )]
    NoTemplate(String),
}

fn jinja_error(e: minijinja::Error) -> TemplateError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    TemplateError::Jinja(msg.replace('\n', " "))
}

/// A Jinja chat template, parsed once.
pub struct JinjaTemplate {
    env: Box<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for JinjaTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JinjaTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const TEMPLATE_NAME: &str = "chat_template";

impl JinjaTemplate {
    /// Parses `source`; `bos_token` and `eos_token` are the texts the template sees.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<JinjaTemplate, TemplateError> {
        let mut env = Environment::new();
        // As transformers' ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(jinja_error)?;
        Ok(JinjaTemplate {
            env: Box::new(env),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(jinja_error)?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(jinja_error)
    }
}

/// How a model wants its conversations written.
#[derive(Debug)]
pub enum ChatTemplate {
    /// The model's own Jinja template.
    Jinja(JinjaTemplate),
    /// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
    /// `<|im_start|>assistant\n`; `default_system` is inserted first when the conversation
    /// does not start with a system message (SmolLM2: [`SMOLLM2_DEFAULT_SYSTEM`]).
    ChatMl { default_system: Option<String> },
    /// Gemma's turns: `<bos>`, then `<start_of_turn>{user|model}\n{content, trimmed}`
    /// `<end_of_turn>\n` per message, then `<start_of_turn>model\n`. A system message
    /// is folded into the first user turn (`{system}\n\n{user}`); user and assistant must
    /// alternate, user first.
    Gemma,
}

impl ChatTemplate {
    /// The GGUF's `tokenizer.chat_template`, or the hand-written format its special
    /// tokens call for.
    pub fn from_gguf(
        file: &GgufFile,
        tokenizer: &Tokenizer,
    ) -> Result<ChatTemplate, TemplateError> {
        let text_of = |id: Option<u32>| {
            id.and_then(|i| tokenizer.token_text(i))
                .unwrap_or_default()
                .to_owned()
        };
        if let Ok(source) = file.get_str("tokenizer.chat_template") {
            let t = JinjaTemplate::new(source, text_of(tokenizer.bos()), text_of(tokenizer.eos()))?;
            return Ok(ChatTemplate::Jinja(t));
        }
        ChatTemplate::for_tokenizer(tokenizer)
            .ok_or_else(|| TemplateError::NoTemplate(file.name().to_owned()))
    }

    /// The hand-written format a vocabulary's special tokens call for: Gemma's turns for
    /// `<start_of_turn>`, ChatML (no default system prompt) for `<|im_start|>`.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Option<ChatTemplate> {
        if tokenizer.special_id("<start_of_turn>").is_some() {
            Some(ChatTemplate::Gemma)
        } else if tokenizer.special_id("<|im_start|>").is_some() {
            Some(ChatTemplate::ChatMl {
                default_system: None,
            })
        } else {
            None
        }
    }

    /// The prompt for `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        match self {
            ChatTemplate::Jinja(t) => t.render(messages, add_generation_prompt),
            ChatTemplate::ChatMl { default_system } => Ok(render_chatml(
                messages,
                add_generation_prompt,
                default_system.as_deref(),
            )),
            ChatTemplate::Gemma => render_gemma(messages, add_generation_prompt),
        }
    }
}

fn render_chatml(
    messages: &[Message],
    add_generation_prompt: bool,
    default_system: Option<&str>,
) -> String {
    let mut out = String::new();
    let turn = |out: &mut String, role: &str, content: &str| {
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        out.push_str(content);
        out.push_str("<|im_end|>\n");
    };
    if let Some(system) = default_system
        && messages.first().is_some_and(|m| m.role != "system")
    {
        turn(&mut out, "system", system);
    }
    for m in messages {
        turn(&mut out, &m.role, &m.content);
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

fn render_gemma(
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<String, TemplateError> {
    let mut out = String::from("<bos>");
    let (first_user_prefix, turns) = match messages.split_first() {
        Some((first, rest)) if first.role == "system" => (Some(first.content.as_str()), rest),
        _ => (None, messages),
    };
    for (i, m) in turns.iter().enumerate() {
        if (m.role == "user") != (i % 2 == 0) {
            return Err(TemplateError::Conversation(
                "Conversation roles must alternate user/assistant/user/assistant/...".to_owned(),
            ));
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            &m.role
        };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if i == 0
            && let Some(system) = first_user_prefix
        {
            out.push_str(system);
            out.push_str("\n\n");
        }
        out.push_str(m.content.trim());
        out.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    Ok(out)
}
