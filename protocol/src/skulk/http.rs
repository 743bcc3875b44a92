//! Typed HTTP intents for the management API: what to send, not how.
//!
//! A runtime turns an [`HttpIntent`] into a request against ONE management origin. The
//! origin and its credentials are runtime concerns: credentials stay scoped to that
//! origin and are never forwarded to another host, a proxy destination or a redirect.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::api::{CreateInstanceRequest, PlaceInstanceParams};
use super::chat::ChatCompletionRequest;
use super::common::{CommandId, InstanceId, ModelId};
use crate::ids::NodeId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        })
    }
}

/// One request to make: method, path (already escaped where it needs to be), query pairs
/// (unescaped; repeated keys allowed) and an optional JSON body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HttpIntent {
    pub method: Method,
    pub path: String,
    #[serde(default)]
    pub query: Vec<(String, String)>,
    #[serde(default)]
    pub body: Option<Value>,
}

impl HttpIntent {
    pub fn get(path: impl Into<String>) -> HttpIntent {
        HttpIntent {
            method: Method::Get,
            path: path.into(),
            query: Vec::new(),
            body: None,
        }
    }

    pub fn post(path: impl Into<String>, body: Value) -> HttpIntent {
        HttpIntent {
            method: Method::Post,
            path: path.into(),
            query: Vec::new(),
            body: Some(body),
        }
    }

    pub fn delete(path: impl Into<String>) -> HttpIntent {
        HttpIntent {
            method: Method::Delete,
            path: path.into(),
            query: Vec::new(),
            body: None,
        }
    }

    pub fn with_query(mut self, key: &str, value: impl Into<String>) -> HttpIntent {
        self.query.push((key.to_owned(), value.into()));
        self
    }

    /// The path with its percent-encoded query string, e.g.
    /// `/instance/previews?model_id=mlx-community%2FLlama&node_ids=A`.
    pub fn path_and_query(&self) -> String {
        if self.query.is_empty() {
            return self.path.clone();
        }
        let query = self
            .query
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        format!("{}?{}", self.path, query)
    }

    /// Values of a query key, in order.
    pub fn query_values(&self, key: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    // The endpoints. Paths follow Skulk 1.3.0 (`skulk-api-1.3.0.md`).

    pub fn node_id() -> HttpIntent {
        HttpIntent::get("/node_id")
    }

    pub fn node_identity() -> HttpIntent {
        HttpIntent::get("/node/identity")
    }

    pub fn state() -> HttpIntent {
        HttpIntent::get("/state")
    }

    pub fn events() -> HttpIntent {
        HttpIntent::get("/events")
    }

    /// `GET /instance/previews?model_id=…&node_ids=…` (node_ids is subset matching).
    pub fn previews<'a>(
        model_id: &ModelId,
        node_ids: impl IntoIterator<Item = &'a NodeId>,
        excluded: impl IntoIterator<Item = &'a NodeId>,
    ) -> HttpIntent {
        let mut intent =
            HttpIntent::get("/instance/previews").with_query("model_id", model_id.as_str());
        for node in node_ids {
            intent = intent.with_query("node_ids", node.as_str());
        }
        for node in excluded {
            intent = intent.with_query("excluded_node_ids", node.as_str());
        }
        intent
    }

    /// `GET /instance/placement?model_id=…&sharding=…&instance_meta=…&min_nodes=…`.
    pub fn placement(params: &PlaceInstanceParams) -> HttpIntent {
        HttpIntent::get("/instance/placement")
            .with_query("model_id", params.model_id.as_str())
            .with_query("sharding", params.sharding.as_str())
            .with_query("instance_meta", params.instance_meta.as_str())
            .with_query("min_nodes", params.min_nodes.to_string())
    }

    pub fn create_instance(
        request: &CreateInstanceRequest,
    ) -> Result<HttpIntent, serde_json::Error> {
        Ok(HttpIntent::post(
            "/instance",
            serde_json::to_value(request)?,
        ))
    }

    pub fn place_instance(params: &PlaceInstanceParams) -> Result<HttpIntent, serde_json::Error> {
        Ok(HttpIntent::post(
            "/place_instance",
            serde_json::to_value(params)?,
        ))
    }

    pub fn get_instance(id: &InstanceId) -> HttpIntent {
        HttpIntent::get(format!("/instance/{}", percent_encode(id.as_str())))
    }

    pub fn delete_instance(id: &InstanceId) -> HttpIntent {
        HttpIntent::delete(format!("/instance/{}", percent_encode(id.as_str())))
    }

    /// `GET /v1/models`, optionally `?status=downloaded`.
    pub fn models(downloaded_only: bool) -> HttpIntent {
        let intent = HttpIntent::get("/v1/models");
        if downloaded_only {
            intent.with_query("status", "downloaded")
        } else {
            intent
        }
    }

    /// Newer dialect: `GET /models/requirements?model_id=…&context_tokens=…`.
    pub fn model_requirements(model_id: &ModelId, context_tokens: Option<u64>) -> HttpIntent {
        let intent =
            HttpIntent::get("/models/requirements").with_query("model_id", model_id.as_str());
        match context_tokens {
            Some(tokens) => intent.with_query("context_tokens", tokens.to_string()),
            None => intent,
        }
    }

    pub fn chat_completions(
        request: &ChatCompletionRequest,
    ) -> Result<HttpIntent, serde_json::Error> {
        Ok(HttpIntent::post(
            "/v1/chat/completions",
            serde_json::to_value(request)?,
        ))
    }

    pub fn cancel_command(id: &CommandId) -> HttpIntent {
        HttpIntent::post(
            format!("/v1/cancel/{}", percent_encode(id.as_str())),
            Value::Null,
        )
    }

    /// `DELETE /download/{node}/{model}`: the model id's slash stays unescaped (a path
    /// parameter in Skulk).
    pub fn delete_download(node: &NodeId, model: &ModelId) -> HttpIntent {
        let model_path = model
            .as_str()
            .split('/')
            .map(percent_encode)
            .collect::<Vec<_>>()
            .join("/");
        HttpIntent::delete(format!(
            "/download/{}/{}",
            percent_encode(node.as_str()),
            model_path
        ))
    }
}

impl fmt::Display for HttpIntent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path_and_query())
    }
}

/// Percent-encodes everything except RFC 3986 unreserved characters.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_repeat_node_ids_and_escape_the_model() {
        let model = ModelId::from("mlx-community/Llama 1B");
        let nodes = [NodeId::from("A"), NodeId::from("B")];
        let intent = HttpIntent::previews(&model, &nodes, []);
        assert_eq!(
            intent.path_and_query(),
            "/instance/previews?model_id=mlx-community%2FLlama%201B&node_ids=A&node_ids=B"
        );
        assert_eq!(intent.query_values("node_ids"), vec!["A", "B"]);
    }

    #[test]
    fn delete_download_keeps_the_model_slash() {
        let intent = HttpIntent::delete_download(&NodeId::from("n1"), &ModelId::from("org/m"));
        assert_eq!(intent.to_string(), "DELETE /download/n1/org/m");
    }
}
