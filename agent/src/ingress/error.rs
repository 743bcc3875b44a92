//! The OpenAI error envelope and how every failure maps onto it.
//!
//! Every 4xx/5xx the ingress sends has the body
//! `{"error":{"message":…,"type":…,"param":…,"code":…}}`, the shape the official clients
//! parse into typed exceptions (`BadRequestError`, `NotFoundError`, …). The same object,
//! wrapped the same way, is the error frame of a stream that fails after it started.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use den_protocol::router::RouterError;

use crate::serving::SubmitError;

/// One error as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: ErrorType,
    /// One line: what was wrong and what to do.
    pub message: String,
    /// The request field at fault, when there is one (`messages[2].role`).
    pub param: Option<String>,
    /// A stable machine-readable code (`model_not_found`, `context_length_exceeded`, …).
    pub code: &'static str,
}

/// The envelope's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// The request itself is wrong; resending it unchanged fails again.
    InvalidRequest,
    /// The cluster could not serve a well-formed request.
    Server,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequest => "invalid_request_error",
            ErrorType::Server => "server_error",
        }
    }
}

impl ApiError {
    /// 400 `invalid_request_error` about one field.
    pub fn invalid(
        param: impl Into<String>,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: ErrorType::InvalidRequest,
            message: message.into(),
            param: Some(param.into()),
            code,
        }
    }

    /// 400 `invalid_request_error` about the request as a whole.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: ErrorType::InvalidRequest,
            message: message.into(),
            param: None,
            code,
        }
    }

    /// A server-side failure with the given status.
    pub fn server(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind: ErrorType::Server,
            message: message.into(),
            param: None,
            code,
        }
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The unknown-model error: 404 like OpenAI, so clients raise `NotFoundError`.
    pub fn model_not_found(model: &str, known: &[String]) -> Self {
        let known = if known.is_empty() {
            "no model is served right now (no live worker advertises one)".to_owned()
        } else {
            format!("served models: {}", known.join(", "))
        };
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: ErrorType::InvalidRequest,
            message: format!("The model `{model}` does not exist or is not served here; {known}"),
            param: Some("model".into()),
            code: "model_not_found",
        }
    }

    /// A terminal router error.
    pub fn from_router(error: &RouterError) -> Self {
        let (status, code) = match error {
            RouterError::NoFeasibleWorker { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "no_feasible_worker")
            }
            RouterError::DeadlineExceeded { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded")
            }
            RouterError::WorkerUnavailableAfterStream { .. } => {
                (StatusCode::BAD_GATEWAY, "worker_unavailable")
            }
            RouterError::WorkerFailedAfterStream { .. } => {
                (StatusCode::BAD_GATEWAY, "worker_failed")
            }
        };
        ApiError::server(status, code, error.to_string())
    }

    /// A submission the router refused before routing.
    pub fn from_submit(error: &SubmitError) -> Self {
        let (status, code) = match error {
            SubmitError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            SubmitError::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            SubmitError::DuplicateId(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "duplicate_request_id")
            }
            SubmitError::UnknownInstance(_) => {
                return ApiError {
                    status: StatusCode::NOT_FOUND,
                    kind: ErrorType::InvalidRequest,
                    message: error.to_string(),
                    param: Some("den_instance".into()),
                    code: "instance_not_found",
                };
            }
            SubmitError::InstanceModel { .. } => {
                return ApiError::invalid("den_instance", "invalid_value", error.to_string());
            }
        };
        ApiError::server(status, code, error.to_string())
    }

    /// The router cancelled a request this client did not abandon (shutdown, operator).
    pub fn cancelled_by_router() -> Self {
        ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            "request_cancelled",
            "the request was cancelled by the router before it finished (shutdown or operator cancel): resubmit it",
        )
    }

    /// The router closed the delivery stream without a terminal delivery.
    pub fn lost() -> Self {
        ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "the router closed the request without a result: resubmit it",
        )
    }

    /// The JSON body: `{"error":{…}}`.
    pub fn body(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Envelope<'a> {
            error: Inner<'a>,
        }
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: &'a str,
        }
        let envelope = Envelope {
            error: Inner {
                message: &self.message,
                kind: self.kind.as_str(),
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        // Serialising plain strings into a Vec cannot fail.
        serde_json::to_vec(&envelope).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        crate::router::http::retry_after(&mut response);
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_the_openai_shape() {
        let e = ApiError::invalid("messages", "invalid_value", "messages is empty");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["message"], "messages is empty");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "messages");
        assert_eq!(v["error"]["code"], "invalid_value");
        let e = ApiError::lost();
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert!(v["error"]["param"].is_null());
        assert_eq!(v["error"]["type"], "server_error");
    }

    #[test]
    fn router_errors_map_to_distinct_statuses() {
        let deadline = RouterError::DeadlineExceeded {
            deadline: den_protocol::time::Millis(5),
        };
        assert_eq!(
            ApiError::from_router(&deadline).status,
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            ApiError::from_submit(&SubmitError::ShuttingDown).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
