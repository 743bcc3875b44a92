//! Shared-token authentication for agent and console connections.
//!
//! Tokens are compared in constant time so a remote peer cannot learn a token byte by
//! byte from response timing. Tokens never appear in logs: [`Token`]'s `Debug` and
//! `Display` print a redaction marker.

use std::fmt;

use subtle::ConstantTimeEq;

/// A shared secret. Cheap to clone; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A token from configuration; empty strings are treated as "no token".
    pub fn new(s: impl Into<String>) -> Option<Token> {
        let s = s.into();
        if s.is_empty() { None } else { Some(Token(s)) }
    }

    /// The token in `path` (its first line, surrounding whitespace removed), so no secret
    /// needs to sit in argv or a unit file. One-line errors name the file; the token is
    /// never in them.
    pub fn from_file(path: &std::path::Path) -> Result<Token, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        let line = text.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            return Err(format!(
                "the token file {} is empty: write the token on its first line",
                path.display()
            ));
        }
        Ok(Token(line.to_owned()))
    }

    /// `--token` or `--token-file` (not both), flags and environment over the config file.
    pub fn choose(
        flag: Option<&str>,
        flag_file: Option<&std::path::Path>,
        file: Option<&str>,
        file_file: Option<&std::path::Path>,
    ) -> Result<Option<Token>, String> {
        match (flag, flag_file) {
            (Some(_), Some(_)) => {
                return Err("give --token or --token-file, not both".into());
            }
            (Some(t), None) => return Ok(Token::new(t)),
            (None, Some(p)) => return Token::from_file(p).map(Some),
            (None, None) => {}
        }
        match (file, file_file) {
            (Some(_), Some(_)) => {
                Err("the config file gives both token and token_file: keep one".into())
            }
            (Some(t), None) => Ok(Token::new(t)),
            (None, Some(p)) => Token::from_file(p).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The secret itself, for putting into an outgoing `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `Bearer <token>`.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Constant-time comparison against a presented secret.
    pub fn matches(&self, presented: &str) -> bool {
        // Lengths leak through `ct_eq` returning early on length mismatch; the token's
        // length is not the secret, its bytes are.
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error(
        "missing Authorization header: send `Authorization: Bearer <token>` (the shared token, DEN_TOKEN)"
    )]
    Missing,
    #[error("malformed Authorization header: expected `Bearer <token>`")]
    Malformed,
    #[error("wrong token: check that this client and the router share the same DEN_TOKEN")]
    Wrong,
    #[error(
        "this API key reaches only the inference endpoints (/v1/chat/completions, /v1/completions, /v1/models, /v1/generate, /tokenize, /detokenize): use the cluster token"
    )]
    InferenceKeyOnly,
}

impl AuthError {
    /// 403 for a valid credential of the wrong scope, 401 otherwise.
    pub fn status(self) -> u16 {
        match self {
            AuthError::InferenceKeyOnly => 403,
            _ => 401,
        }
    }
}

/// The secret of a `Bearer` header value.
pub fn bearer(header: &str) -> Option<&str> {
    header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .map(str::trim)
}

/// The inference endpoints' check: the cluster token or one of the API keys. Open when
/// neither is configured.
pub fn check_inference(
    token: Option<&Token>,
    keys: Option<&crate::api_keys::ApiKeys>,
    header: Option<&str>,
) -> Result<(), AuthError> {
    if token.is_none() && keys.is_none() {
        return Ok(());
    }
    let header = header.ok_or(AuthError::Missing)?;
    let presented = bearer(header).ok_or(AuthError::Malformed)?;
    let by_token = token.is_some_and(|t| t.matches(presented));
    let by_key = keys.is_some_and(|k| k.contains(presented));
    if by_token || by_key {
        Ok(())
    } else {
        Err(AuthError::Wrong)
    }
}

/// Check an `Authorization` header value against the expected token. With no expected
/// token configured every request is allowed (loopback demos); the router logs a warning
/// at start-up when it listens on a non-loopback address without one.
pub fn check(expected: Option<&Token>, header: Option<&str>) -> Result<(), AuthError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let header = header.ok_or(AuthError::Missing)?;
    let presented = bearer(header).ok_or(AuthError::Malformed)?;
    if expected.matches(presented) {
        Ok(())
    } else {
        Err(AuthError::Wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_shared_token() {
        let t = Token::new("s3cret").unwrap();
        assert_eq!(check(Some(&t), Some("Bearer s3cret")), Ok(()));
        assert_eq!(check(Some(&t), Some("Bearer s3cre")), Err(AuthError::Wrong));
        assert_eq!(
            check(Some(&t), Some("Basic abc")),
            Err(AuthError::Malformed)
        );
        assert_eq!(check(Some(&t), None), Err(AuthError::Missing));
        assert_eq!(check(None, None), Ok(()));
        assert!(Token::new("").is_none());
    }

    #[test]
    fn never_prints_the_secret() {
        let t = Token::new("s3cret").unwrap();
        assert!(!format!("{t:?} {t}").contains("s3cret"));
    }
}

#[cfg(test)]
mod token_file_tests {
    use super::*;

    #[test]
    fn a_token_file_gives_its_first_line_and_errors_never_show_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "  s3cret-token \nsecond line\n").unwrap();
        assert_eq!(Token::from_file(&p).unwrap().expose(), "s3cret-token");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = Token::from_file(&empty).unwrap_err();
        assert!(e.contains("empty") && e.contains("empty"), "{e}");
        let e = Token::from_file(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("missing") && !e.contains('\n'), "{e}");

        // Flags over the file; a token and a file on one level is an error.
        let chosen = Token::choose(None, Some(&p), Some("from-config"), None).unwrap();
        assert_eq!(chosen.unwrap().expose(), "s3cret-token");
        let chosen = Token::choose(None, None, None, Some(&p)).unwrap();
        assert_eq!(chosen.unwrap().expose(), "s3cret-token");
        assert!(Token::choose(Some("a"), Some(&p), None, None).is_err());
        assert!(Token::choose(None, None, Some("a"), Some(&p)).is_err());
        assert!(Token::choose(None, None, None, None).unwrap().is_none());
        let e = Token::choose(None, Some(&empty), None, None).unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
    }
}
