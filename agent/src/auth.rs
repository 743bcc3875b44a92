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
}

/// Check an `Authorization` header value against the expected token. With no expected
/// token configured every request is allowed (loopback demos); the router logs a warning
/// at start-up when it listens on a non-loopback address without one.
pub fn check(expected: Option<&Token>, header: Option<&str>) -> Result<(), AuthError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let header = header.ok_or(AuthError::Missing)?;
    let presented = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or(AuthError::Malformed)?;
    if expected.matches(presented.trim()) {
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
