//! Object tier locations and settings: `s3://bucket/prefix`, `file:///absolute/dir` and
//! `memory://[prefix]`, plus S3 endpoint, region and credentials from explicit settings or
//! the usual AWS environment variables. Secrets are wrapped in [`Secret`], whose `Debug`
//! and `Display` print `<redacted>`, so a logged configuration never shows them.

use std::fmt;
use std::path::{Component, PathBuf};
use std::str::FromStr;

/// Where the object tier keeps chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectUrl {
    /// An S3-compatible bucket; `prefix` has no leading or trailing slash ("" for none).
    S3 { bucket: String, prefix: String },
    /// A local directory (absolute), through object_store's local file system store.
    File { dir: PathBuf },
    /// Process memory (tests, demos); lost on exit.
    Memory { prefix: String },
}

/// A URL that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid object store URL {url:?}: {reason}")]
pub struct UrlError {
    pub url: String,
    pub reason: String,
}

const FORMS: &str = "use s3://bucket/prefix, file:///absolute/dir or memory://";

impl FromStr for ObjectUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| UrlError {
            url: s.to_owned(),
            reason,
        };
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Err(err(format!("it is empty; {FORMS}")));
        }
        let Some((scheme, rest)) = trimmed.split_once("://") else {
            return Err(err(format!("it has no scheme; {FORMS}")));
        };
        if rest.contains(['?', '#']) {
            return Err(err("query strings and fragments are not supported".into()));
        }
        match scheme.to_ascii_lowercase().as_str() {
            "s3" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                check_bucket(bucket).map_err(err)?;
                Ok(ObjectUrl::S3 {
                    bucket: bucket.to_owned(),
                    prefix: normalise_prefix(prefix).map_err(err)?,
                })
            }
            "file" => {
                if !rest.starts_with('/') {
                    return Err(err(
                        "a file URL needs an absolute path after file:// (three slashes, e.g. file:///var/lib/den/objects)"
                            .into(),
                    ));
                }
                let dir = PathBuf::from(rest);
                if dir
                    .components()
                    .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
                {
                    return Err(err("the path must not contain . or .. segments".into()));
                }
                Ok(ObjectUrl::File { dir })
            }
            "memory" => Ok(ObjectUrl::Memory {
                prefix: normalise_prefix(rest).map_err(err)?,
            }),
            other => Err(err(format!("unknown scheme {other:?}; {FORMS}"))),
        }
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectUrl::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            ObjectUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            ObjectUrl::File { dir } => write!(f, "file://{}", dir.display()),
            ObjectUrl::Memory { prefix } => write!(f, "memory://{prefix}"),
        }
    }
}

/// A credential. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself, for handing to the client. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// S3 client settings. Unset fields fall back to the environment ([`S3Settings::from_env`])
/// and then to defaults: region `us-east-1`, path-style requests, HTTP allowed only when
/// the endpoint is an `http://` URL.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// e.g. `http://127.0.0.1:9000` for a local server; AWS when unset.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Not a secret by AWS's rules, but still not logged (only whether it is set).
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    pub session_token: Option<Secret>,
    pub allow_http: Option<bool>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |o: bool| if o { "<set>" } else { "<unset>" };
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &set(self.access_key_id.is_some()))
            .field("secret_access_key", &set(self.secret_access_key.is_some()))
            .field("session_token", &set(self.session_token.is_some()))
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

impl S3Settings {
    /// Reads `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`), `AWS_REGION` (or
    /// `AWS_DEFAULT_REGION`), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN` and `AWS_ALLOW_HTTP`. Empty values count as unset.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`S3Settings::from_env`] over any lookup function (testable).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let var = |names: &[&str]| {
            names.iter().find_map(|n| {
                get(n)
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
            })
        };
        S3Settings {
            endpoint: var(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]),
            region: var(&["AWS_REGION", "AWS_DEFAULT_REGION"]),
            access_key_id: var(&["AWS_ACCESS_KEY_ID"]),
            secret_access_key: var(&["AWS_SECRET_ACCESS_KEY"]).map(Secret),
            session_token: var(&["AWS_SESSION_TOKEN"]).map(Secret),
            allow_http: var(&["AWS_ALLOW_HTTP"])
                .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")),
        }
    }

    /// These settings, with unset fields taken from `fallback`.
    pub fn or(self, fallback: S3Settings) -> S3Settings {
        S3Settings {
            endpoint: self.endpoint.or(fallback.endpoint),
            region: self.region.or(fallback.region),
            access_key_id: self.access_key_id.or(fallback.access_key_id),
            secret_access_key: self.secret_access_key.or(fallback.secret_access_key),
            session_token: self.session_token.or(fallback.session_token),
            allow_http: self.allow_http.or(fallback.allow_http),
        }
    }

    /// Checks the endpoint and that credentials come in pairs.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(ep) = &self.endpoint {
            let lower = ep.to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://")) {
                return Err(format!(
                    "endpoint {ep:?} must start with http:// or https:// (e.g. http://127.0.0.1:9000)"
                ));
            }
            if lower.starts_with("http://") && self.allow_http == Some(false) {
                return Err(format!(
                    "endpoint {ep:?} is plain HTTP but allow_http is off; use https:// or allow HTTP"
                ));
            }
        }
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(_), None) => Err(
                "an access key id is set but no secret access key: set AWS_SECRET_ACCESS_KEY too"
                    .into(),
            ),
            (None, Some(_)) => Err(
                "a secret access key is set but no access key id: set AWS_ACCESS_KEY_ID too".into(),
            ),
            _ => Ok(()),
        }
    }

    /// Whether plain HTTP is allowed: explicit setting, else true for an `http://` endpoint.
    pub fn http_allowed(&self) -> bool {
        self.allow_http.unwrap_or_else(|| {
            self.endpoint
                .as_deref()
                .is_some_and(|e| e.to_ascii_lowercase().starts_with("http://"))
        })
    }
}

/// Everything needed to open an object tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectConfig {
    pub url: ObjectUrl,
    pub s3: S3Settings,
}

impl ObjectConfig {
    /// Parses `url` and takes S3 settings from the environment.
    pub fn from_url_and_env(url: &str) -> Result<Self, UrlError> {
        Ok(ObjectConfig {
            url: url.parse()?,
            s3: S3Settings::from_env(),
        })
    }
}

fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err(format!("the bucket name is missing; {FORMS}"));
    }
    let ok_chars = bucket
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if !(3..=63).contains(&bucket.len()) || !ok_chars {
        return Err(format!(
            "bucket {bucket:?} is not a valid S3 bucket name: 3–63 lowercase letters, digits, '-' or '.'"
        ));
    }
    Ok(())
}

fn normalise_prefix(p: &str) -> Result<String, String> {
    let p = p.trim_matches('/');
    if p.is_empty() {
        return Ok(String::new());
    }
    for seg in p.split('/') {
        if seg.is_empty() {
            return Err("the prefix has an empty path segment (//)".into());
        }
        if seg == "." || seg == ".." {
            return Err("the prefix must not contain . or .. segments".into());
        }
    }
    Ok(p.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms_parse_and_print_canonically() {
        let u: ObjectUrl = "s3://den-chunks/cluster/a/".parse().unwrap();
        assert_eq!(
            u,
            ObjectUrl::S3 {
                bucket: "den-chunks".into(),
                prefix: "cluster/a".into()
            }
        );
        assert_eq!(u.to_string(), "s3://den-chunks/cluster/a");
        assert_eq!(
            "S3://bkt".parse::<ObjectUrl>().unwrap(),
            ObjectUrl::S3 {
                bucket: "bkt".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            "file:///var/lib/den".parse::<ObjectUrl>().unwrap(),
            ObjectUrl::File {
                dir: "/var/lib/den".into()
            }
        );
        assert_eq!(
            "memory://".parse::<ObjectUrl>().unwrap(),
            ObjectUrl::Memory {
                prefix: String::new()
            }
        );
        assert_eq!(
            "memory:///x/y".parse::<ObjectUrl>().unwrap().to_string(),
            "memory://x/y"
        );
    }

    #[test]
    fn bad_urls_get_clear_errors() {
        for (url, needle) in [
            ("", "empty"),
            ("bucket/prefix", "no scheme"),
            ("gs://b/p", "unknown scheme"),
            ("s3://", "bucket name is missing"),
            ("s3:///prefix", "bucket name is missing"),
            ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
            ("s3://bucket/a//b", "empty path segment"),
            ("s3://bucket/../x", ". or .."),
            ("s3://bucket/x?versionId=1", "query strings"),
            ("file://relative/dir", "absolute path"),
            ("file:///a/../b", ". or .."),
        ] {
            let e = url.parse::<ObjectUrl>().unwrap_err();
            assert!(e.to_string().contains(needle), "{url}: {e}");
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn settings_come_from_env_names_and_never_print_secrets() {
        let env = |k: &str| match k {
            "AWS_ENDPOINT_URL" => Some("http://127.0.0.1:9000".to_owned()),
            "AWS_DEFAULT_REGION" => Some("eu-west-1".to_owned()),
            "AWS_ACCESS_KEY_ID" => Some("AKIDEXAMPLE".to_owned()),
            "AWS_SECRET_ACCESS_KEY" => Some("wJalrXUtnFEMI".to_owned()),
            "AWS_SESSION_TOKEN" => Some(String::new()),
            _ => None,
        };
        let s = S3Settings::from_lookup(env);
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(s.region.as_deref(), Some("eu-west-1"));
        assert_eq!(s.session_token, None);
        assert!(s.http_allowed());
        assert!(s.validate().is_ok());
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("wJalrXUtnFEMI") && !shown.contains("AKIDEXAMPLE"),
            "{shown}"
        );
        let cfg = ObjectConfig {
            url: "s3://b12/p".parse().unwrap(),
            s3: s.clone(),
        };
        assert!(!format!("{cfg:?}").contains("wJalrXUtnFEMI"));
        // Explicit settings win over the environment.
        let explicit = S3Settings {
            region: Some("us-west-2".into()),
            ..Default::default()
        };
        assert_eq!(explicit.or(s).region.as_deref(), Some("us-west-2"));
    }

    #[test]
    fn settings_validation_catches_half_credentials_and_bad_endpoints() {
        let half = S3Settings {
            access_key_id: Some("a".into()),
            ..Default::default()
        };
        assert!(
            half.validate()
                .unwrap_err()
                .contains("AWS_SECRET_ACCESS_KEY")
        );
        let ep = S3Settings {
            endpoint: Some("127.0.0.1:9000".into()),
            ..Default::default()
        };
        assert!(ep.validate().unwrap_err().contains("http://"));
        let no_http = S3Settings {
            endpoint: Some("http://h:1".into()),
            allow_http: Some(false),
            ..Default::default()
        };
        assert!(no_http.validate().is_err());
        assert!(!S3Settings::default().http_allowed());
    }
}
