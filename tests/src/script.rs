//! The fixture server's script: which responses each route serves, in order.
//!
//! A script is a JSON file:
//! ```json
//! {
//!   "description": "accepted and ready",
//!   "routes": [
//!     { "method": "GET", "path": "/node_id",
//!       "responses": [ { "file": "../skulk-1.3.0/runC/node_id.json" } ] },
//!     { "method": "GET", "path": "/state",
//!       "responses": [ { "file": "../skulk-1.3.0/runC/state_idle.json", "repeat": 2 },
//!                      { "file": "../scenarios/state_created_instance_ready.json" } ] },
//!     { "method": "POST", "path": "/instance",
//!       "responses": [ { "action": "drop-after-read" } ] },
//!     { "method": "GET", "path": "/redirect-me",
//!       "responses": [ { "status": 307, "headers": { "location": "${OTHER}/x" } } ] }
//!   ],
//!   "fallback": { "status": 404, "json": { "detail": "Not Found" } }
//! }
//! ```
//! - A route matches on `method` (case-insensitive) and `path` (exact; a trailing `*`
//!   matches a prefix). The query string is ignored unless `query` lists pairs that must
//!   all be present (`{"model_id": "org/m"}`, values percent-decoded). The first matching
//!   route wins.
//! - `responses` are served in order; each one `repeat` times (default 1); the last one
//!   repeats forever.
//! - A response: `status` (default 200), `headers` (object), a body from `body` (text),
//!   `json` (any JSON value) or `file` (path relative to the script's directory), an
//!   optional `content_type` (default from the body: `.json`/`json` → application/json,
//!   `.sse` → text/event-stream, otherwise text/plain), `delay_ms` before answering, and
//!   `action`: `respond` (default) or `drop-after-read` (read the whole request, then
//!   close the connection without answering: a lost response).
//! - `fallback` answers requests no route matches; by default FastAPI's 404
//!   `{"detail":"Not Found"}`, which is what Skulk 1.3.0 says for a route it lacks.
//! - `${NAME}` anywhere in the script is replaced by the value of `--var NAME=VALUE`
//!   (JSON-escaped); an undefined variable is an error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

/// The script file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptFile {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    #[serde(default)]
    pub fallback: Option<ResponseSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    pub responses: Vec<ResponseSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseSpec {
    #[serde(default)]
    pub action: Action,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub json: Option<Value>,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub repeat: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    #[default]
    Respond,
    DropAfterRead,
}

/// A script ready to serve: bodies read, responses expanded by `repeat`.
#[derive(Debug, Clone)]
pub struct Script {
    pub description: Option<String>,
    pub routes: Vec<Route>,
    pub fallback: Arc<Response>,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    /// Already expanded by `repeat`; never empty.
    pub responses: Vec<Arc<Response>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub action: Action,
    pub status: u16,
    /// Lower-case names; content-type included.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub delay_ms: u64,
}

/// A script that cannot be used; the message names the file and the place in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptError(pub String);

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScriptError {}

impl Script {
    /// Reads and checks a script file, substituting `vars`.
    pub fn load(path: &Path, vars: &BTreeMap<String, String>) -> Result<Script, ScriptError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScriptError(format!("cannot read script {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new(".")).to_owned();
        Script::parse(&text, &base, vars)
            .map_err(|e| ScriptError(format!("script {}: {e}", path.display())))
    }

    /// Parses script text; `file` paths are relative to `base`.
    pub fn parse(
        text: &str,
        base: &Path,
        vars: &BTreeMap<String, String>,
    ) -> Result<Script, ScriptError> {
        let text = substitute(text, vars)?;
        let file: ScriptFile =
            serde_json::from_str(&text).map_err(|e| ScriptError(format!("not a script: {e}")))?;
        let mut routes = Vec::new();
        for (i, spec) in file.routes.into_iter().enumerate() {
            let at = format!("route {i} ({} {})", spec.method, spec.path);
            if !spec.path.starts_with('/') {
                return Err(ScriptError(format!("{at}: path must start with '/'")));
            }
            if spec.responses.is_empty() {
                return Err(ScriptError(format!("{at}: no responses")));
            }
            let mut responses = Vec::new();
            for (j, r) in spec.responses.iter().enumerate() {
                let response = Arc::new(
                    load_response(r, base)
                        .map_err(|e| ScriptError(format!("{at}, response {j}: {e}")))?,
                );
                let times = r.repeat.unwrap_or(1);
                if times == 0 {
                    return Err(ScriptError(format!(
                        "{at}, response {j}: repeat must be at least 1"
                    )));
                }
                for _ in 0..times {
                    responses.push(Arc::clone(&response));
                }
            }
            routes.push(Route {
                method: spec.method.to_ascii_uppercase(),
                path: spec.path,
                query: spec.query,
                responses,
            });
        }
        let fallback = match &file.fallback {
            Some(r) => load_response(r, base).map_err(|e| ScriptError(format!("fallback: {e}")))?,
            None => not_found(),
        };
        Ok(Script {
            description: file.description,
            routes,
            fallback: Arc::new(fallback),
        })
    }

    /// The first route matching a request, by index.
    pub fn route_for(&self, method: &str, path: &str, query: &[(String, String)]) -> Option<usize> {
        self.routes.iter().position(|r| {
            r.method.eq_ignore_ascii_case(method)
                && path_matches(&r.path, path)
                && r.query
                    .iter()
                    .all(|(k, v)| query.iter().any(|(qk, qv)| qk == k && qv == v))
        })
    }
}

/// FastAPI's answer for a route it does not have.
pub fn not_found() -> Response {
    Response {
        action: Action::Respond,
        status: 404,
        headers: BTreeMap::from([("content-type".to_owned(), "application/json".to_owned())]),
        body: br#"{"detail":"Not Found"}"#.to_vec(),
        delay_ms: 0,
    }
}

fn path_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}

fn load_response(spec: &ResponseSpec, base: &Path) -> Result<Response, String> {
    let sources = [
        spec.body.is_some(),
        spec.json.is_some(),
        spec.file.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if sources > 1 {
        return Err("give at most one of body, json and file".to_owned());
    }
    let (body, default_type) = if let Some(text) = &spec.body {
        (text.clone().into_bytes(), "text/plain; charset=utf-8")
    } else if let Some(value) = &spec.json {
        (value.to_string().into_bytes(), "application/json")
    } else if let Some(rel) = &spec.file {
        let path: PathBuf = base.join(rel);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read body file {}: {e}", path.display()))?;
        let kind = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => "application/json",
            Some("sse") => "text/event-stream; charset=utf-8",
            _ => "text/plain; charset=utf-8",
        };
        (bytes, kind)
    } else {
        (Vec::new(), "application/json")
    };
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    headers.insert(
        "content-type".to_owned(),
        spec.content_type
            .clone()
            .unwrap_or_else(|| default_type.to_owned()),
    );
    for (name, value) in &spec.headers {
        let name = name.to_ascii_lowercase();
        if matches!(
            name.as_str(),
            "content-length" | "connection" | "transfer-encoding"
        ) {
            return Err(format!(
                "header {name} is set by the server (one request per connection, \
                 content-length bodies)"
            ));
        }
        headers.insert(name, value.clone());
    }
    Ok(Response {
        action: spec.action,
        status: spec.status.unwrap_or(200),
        headers,
        body,
        delay_ms: spec.delay_ms,
    })
}

/// Replaces `${NAME}` with the JSON-escaped value of `NAME`.
fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, ScriptError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(ScriptError("unterminated ${ in the script".to_owned()));
        };
        let name = &after[..end];
        let Some(value) = vars.get(name) else {
            return Err(ScriptError(format!(
                "variable ${{{name}}} is not defined (pass --var {name}=VALUE)"
            )));
        };
        let quoted = serde_json::to_string(value).map_err(|e| ScriptError(e.to_string()))?;
        // `quoted` is a JSON string literal: drop exactly its two enclosing quotes.
        let inner = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or(&quoted);
        out.push_str(inner);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Decodes an `application/x-www-form-urlencoded` query into pairs.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    // `i < bytes.len()` holds inside the loop, so `bytes[i]` cannot fail.
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(b) => {
                    out.push(b);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Script, ScriptError> {
        Script::parse(text, Path::new("."), &BTreeMap::new())
    }

    #[test]
    fn routes_match_method_path_prefix_and_query() {
        let script = parse(
            r#"{"routes": [
                {"method": "get", "path": "/instance/previews", "query": {"node_ids": "B"},
                 "responses": [{"json": 1}]},
                {"method": "GET", "path": "/instance/*", "responses": [{"json": 2}]}
            ]}"#,
        )
        .expect("parses");
        let q = parse_query("model_id=org%2Fm&node_ids=A&node_ids=B");
        assert_eq!(q[0], ("model_id".into(), "org/m".into()));
        assert_eq!(script.route_for("GET", "/instance/previews", &q), Some(0));
        assert_eq!(script.route_for("GET", "/instance/previews", &[]), Some(1));
        assert_eq!(script.route_for("POST", "/instance/previews", &q), None);
        assert_eq!(script.route_for("GET", "/state", &[]), None);
        assert_eq!(script.fallback.status, 404);
    }

    #[test]
    fn repeat_expands_and_bad_scripts_say_where() {
        let script = parse(
            r#"{"routes": [{"method": "GET", "path": "/state",
                "responses": [{"body": "a", "repeat": 2}, {"action": "drop-after-read"}]}]}"#,
        )
        .expect("parses");
        let responses = &script.routes[0].responses;
        assert_eq!(responses.len(), 3);
        assert_eq!(responses[1].body, b"a");
        assert_eq!(responses[2].action, Action::DropAfterRead);

        let err = parse(r#"{"routes": [{"method": "GET", "path": "/x", "responses": [{"file": "nope.json"}]}]}"#)
            .expect_err("missing file");
        assert!(err.0.contains("route 0 (GET /x), response 0"), "{err}");
        assert!(err.0.contains("nope.json"), "{err}");
        let err = parse(r#"{"routes": [{"method": "GET", "path": "/x", "responses": []}]}"#)
            .expect_err("empty");
        assert!(err.0.contains("no responses"), "{err}");
        assert!(parse(r#"{"rutes": []}"#).is_err());
    }

    #[test]
    fn variables_are_substituted_json_escaped() {
        let vars = BTreeMap::from([("OTHER".to_owned(), "http://127.0.0.1:9/\"q\"".to_owned())]);
        let script = Script::parse(
            r#"{"routes": [{"method": "GET", "path": "/r",
                "responses": [{"status": 307, "headers": {"Location": "${OTHER}x"}}]}]}"#,
            Path::new("."),
            &vars,
        )
        .expect("parses");
        let r = &script.routes[0].responses[0];
        assert_eq!(r.headers["location"], "http://127.0.0.1:9/\"q\"x");
        let err = Script::parse(r#"{"x": "${NOPE}"}"#, Path::new("."), &BTreeMap::new())
            .expect_err("undefined");
        assert!(err.0.contains("NOPE"), "{err}");
    }
}
