//! Redaction before writing: secrets and request payloads never reach a recording.
//!
//! Session events are free of secrets by construction (see [`crate::session`]); this is
//! defence in depth for everything that arrives from servers and is passed through
//! (Skulk `/state` task parameters, error details, extension fields). The redactor walks
//! the JSON of a line and:
//!
//! - blanks the value of every *secret* key (authorization, tokens, API keys,
//!   passwords, secrets, credentials, cookies; see [`is_secret_key`]): strings become
//!   `"[redacted]"`, strings inside containers likewise, numbers and booleans stay;
//! - blanks every *payload* key below the top level (prompts, chat messages, content,
//!   completion text, token id lists; see [`is_payload_key`]): strings become
//!   `"[redacted]"`, lists `[]`, objects `{}`; numbers stay, so that token *counts*
//!   survive;
//! - rewrites every string that carries a credential: `Bearer …`/`Basic …` values, URLs
//!   with user info or a query (`scheme://host/path` is kept), and any occurrence of a
//!   configured secret (the console's token).
//!
//! Ids, counts, timings and reasons are kept. The shapes of values are preserved (a
//! string stays a string, a list a list) so that redacted lines still decode into the
//! session types. Redaction is idempotent.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The name of this policy, as headers state it.
pub const POLICY: &str = "den-redact-1";
/// What a blanked string becomes.
pub const REDACTED: &str = "[redacted]";

/// Normalised (lower case, no `_`, `-`, `.`) keys whose values are secrets.
const SECRET_KEYS: &[&str] = &[
    "authorization",
    "proxyauthorization",
    "token",
    "apikey",
    "xapikey",
    "password",
    "passwd",
    "passphrase",
    "secret",
    "credential",
    "credentials",
    "cookie",
    "setcookie",
    "privatekey",
    "accesskey",
    "secretaccesskey",
];
/// Normalised key suffixes whose values are secrets (`hf_token`, `client_secret`…).
const SECRET_SUFFIXES: &[&str] = &[
    "token",
    "secret",
    "password",
    "apikey",
    "credentials",
    "secretkey",
    "accesskey",
];
/// Normalised keys whose values are request or response payloads.
const PAYLOAD_KEYS: &[&str] = &[
    "prompt",
    "prompts",
    "messages",
    "content",
    "reasoningcontent",
    "text",
    "completion",
    "completions",
    "input",
    "inputs",
    "inputids",
    "tokens",
    "tokenids",
    "prompttokenids",
    "outputtokenids",
    "generatedtext",
    "logprobs",
    "toplogprobs",
    "suffix",
    "system",
    "instructions",
];

/// What a header says about redaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedactionPolicy {
    pub policy: String,
    pub secret_keys: Vec<String>,
    pub secret_suffixes: Vec<String>,
    pub payload_keys: Vec<String>,
    /// Rules applied to every string value.
    pub string_rules: Vec<String>,
    /// How many configured secret values are scrubbed wherever they appear.
    pub known_secrets: usize,
}

/// The redactor of one recording.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    known: Vec<String>,
}

impl Redactor {
    /// A redactor that also scrubs the given secret values (e.g. the bearer token)
    /// wherever they appear. Values shorter than 4 characters are ignored (they would
    /// blank ordinary text).
    pub fn new(known_secrets: impl IntoIterator<Item = String>) -> Redactor {
        let mut known: Vec<String> = known_secrets
            .into_iter()
            .filter(|s| s.chars().count() >= 4)
            .collect();
        // Longest first, so that a secret containing another is replaced whole.
        known.sort_by_key(|s| std::cmp::Reverse(s.len()));
        known.dedup();
        Redactor { known }
    }

    pub fn policy(&self) -> RedactionPolicy {
        let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
        RedactionPolicy {
            policy: POLICY.to_owned(),
            secret_keys: list(SECRET_KEYS),
            secret_suffixes: list(SECRET_SUFFIXES),
            payload_keys: list(PAYLOAD_KEYS),
            string_rules: vec![
                "Bearer/Basic credentials".to_owned(),
                "URL user info and queries".to_owned(),
                "configured secret values".to_owned(),
            ],
            known_secrets: self.known.len(),
        }
    }

    /// Redact a line's JSON in place. Payload keys count from below the top level (the
    /// top level of a line is the session event itself, whose `text` is the operator's
    /// command or a console note). Returns how many values were changed.
    pub fn redact(&self, value: &mut Value) -> u64 {
        self.walk(value, 0)
    }

    fn walk(&self, value: &mut Value, depth: usize) -> u64 {
        match value {
            Value::Object(map) => {
                let mut n = 0;
                for (key, v) in map.iter_mut() {
                    let key = normalise(key);
                    if is_secret_key_normalised(&key) {
                        n += blank_strings(v);
                    } else if depth > 0 && PAYLOAD_KEYS.contains(&key.as_str()) {
                        n += blank_payload(v);
                    } else {
                        n += self.walk(v, depth + 1);
                    }
                }
                n
            }
            Value::Array(items) => items.iter_mut().map(|v| self.walk(v, depth + 1)).sum(),
            Value::String(s) => match self.scrub(s) {
                Some(clean) => {
                    *s = clean;
                    1
                }
                None => 0,
            },
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        }
    }

    /// The string without credentials, or `None` when it has none.
    pub fn scrub(&self, s: &str) -> Option<String> {
        let mut out: Option<String> = None;
        let lower = s.trim_start().to_ascii_lowercase();
        if lower.starts_with("bearer ") || lower.starts_with("basic ") {
            return (s != REDACTED).then(|| REDACTED.to_owned());
        }
        if s.contains("://") && (s.contains('@') || s.contains('?') || s.contains('#')) {
            let cleaned = scrub_urls(s);
            if cleaned != s {
                out = Some(cleaned);
            }
        }
        for secret in &self.known {
            let current = out.as_deref().unwrap_or(s);
            if current.contains(secret.as_str()) {
                out = Some(current.replace(secret.as_str(), REDACTED));
            }
        }
        out
    }
}

/// Whether a key names a secret (case and `_`/`-`/`.` insensitive).
pub fn is_secret_key(key: &str) -> bool {
    is_secret_key_normalised(&normalise(key))
}

/// Whether a key names a request or response payload (case and `_`/`-`/`.` insensitive).
pub fn is_payload_key(key: &str) -> bool {
    PAYLOAD_KEYS.contains(&normalise(key).as_str())
}

fn is_secret_key_normalised(key: &str) -> bool {
    SECRET_KEYS.contains(&key) || SECRET_SUFFIXES.iter().any(|s| key.ends_with(s))
}

fn normalise(key: &str) -> String {
    key.chars()
        .filter(|c| !matches!(c, '_' | '-' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect()
}

fn blank_strings(value: &mut Value) -> u64 {
    match value {
        Value::String(s) if s != REDACTED => {
            *s = REDACTED.to_owned();
            1
        }
        Value::Array(items) => items.iter_mut().map(blank_strings).sum(),
        Value::Object(map) => map.values_mut().map(blank_strings).sum(),
        _ => 0,
    }
}

fn blank_payload(value: &mut Value) -> u64 {
    match value {
        Value::String(s) if s != REDACTED => {
            *s = REDACTED.to_owned();
            1
        }
        Value::Array(items) if !items.is_empty() => {
            items.clear();
            1
        }
        Value::Object(map) if !map.is_empty() => {
            map.clear();
            1
        }
        _ => 0,
    }
}

/// Every `scheme://…` word of `s` without user info, query or fragment.
fn scrub_urls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        // The scheme: letters right before `://`.
        let head = rest.get(..i).unwrap_or("");
        let scheme_start = head
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(i, |(j, _)| j);
        out.push_str(rest.get(..scheme_start).unwrap_or(""));
        let url_and_more = rest.get(scheme_start..).unwrap_or("");
        let end = url_and_more
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | ')' | ','))
            .unwrap_or(url_and_more.len());
        let url = url_and_more.get(..end).unwrap_or("");
        out.push_str(&crate::session::redact_url(url));
        rest = url_and_more.get(end..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secret_keys_are_blanked_anywhere_and_numbers_stay() {
        let r = Redactor::default();
        let mut v = json!({
            "at": 1,
            "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k1", "accept": "json"},
            "hf_token": "hf_xyz",
            "nested": [{"client_secret": ["s1", "s2"]}],
            "token": 7,
            "max_new_tokens": 8,
        });
        let n = r.redact(&mut v);
        assert_eq!(n, 5);
        assert_eq!(v["headers"]["Authorization"], REDACTED);
        assert_eq!(v["headers"]["X-Api-Key"], REDACTED);
        assert_eq!(v["headers"]["accept"], "json");
        assert_eq!(v["hf_token"], REDACTED);
        assert_eq!(v["nested"][0]["client_secret"], json!([REDACTED, REDACTED]));
        assert_eq!(v["token"], 7);
        assert_eq!(v["max_new_tokens"], 8);
    }

    #[test]
    fn payloads_are_blanked_below_the_top_level_and_counts_stay() {
        let r = Redactor::default();
        let mut v = json!({
            "event": "note",
            "text": "place llama --node a",
            "state": {"tasks": {"t1": {"taskParams": {
                "messages": [{"role": "user", "content": "the secret plan"}],
                "prompt": "tell me",
                "max_tokens": 16,
                "tokens": [1, 2, 3],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3},
            }}}}
        });
        r.redact(&mut v);
        let params = &v["state"]["tasks"]["t1"]["taskParams"];
        assert_eq!(v["text"], "place llama --node a");
        assert_eq!(params["messages"], json!([]));
        assert_eq!(params["prompt"], REDACTED);
        assert_eq!(params["tokens"], json!([]));
        assert_eq!(params["max_tokens"], 16);
        assert_eq!(params["usage"]["prompt_tokens"], 12);
        assert!(!v.to_string().contains("secret plan"));
    }

    #[test]
    fn strings_lose_credentials_and_known_secrets() {
        let r = Redactor::new(["s3cr3t-token".to_owned(), "ab".to_owned()]);
        assert_eq!(r.policy().known_secrets, 1);
        let mut v = json!({
            "reason": "GET http://user:pw@host:1/state?token=x failed",
            "detail": "server said s3cr3t-token is wrong",
            "auth": "basic dXNlcjpwdw==",
            "url": "http://10.0.0.1:7000/v1",
            "short": "ab stays",
        });
        r.redact(&mut v);
        assert_eq!(v["reason"], "GET http://host:1/state failed");
        assert_eq!(v["detail"], "server said [redacted] is wrong");
        assert_eq!(v["auth"], REDACTED);
        assert_eq!(v["url"], "http://10.0.0.1:7000/v1");
        assert_eq!(v["short"], "ab stays");
        let once = v.clone();
        assert_eq!(r.redact(&mut v), 0, "idempotent");
        assert_eq!(v, once);
    }

    #[test]
    fn key_classes_ignore_case_and_separators() {
        assert!(is_secret_key("Proxy-Authorization"));
        assert!(is_secret_key("AWS_SECRET_ACCESS_KEY"));
        assert!(is_secret_key("aws.secret"));
        assert!(is_secret_key("refreshToken"));
        assert!(!is_secret_key("max_tokens"));
        assert!(!is_secret_key("token_count"));
        assert!(is_payload_key("prompt_token_ids"));
        assert!(!is_payload_key("prompt_tokens"));
        assert!(!is_payload_key("contentLength"));
    }
}
