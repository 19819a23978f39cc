//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the
//! matching HTTP status (and `Retry-After` on 429), so that clients raise their usual
//! exceptions (`openai.BadRequestError`, `RateLimitError`, …).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
    /// Close the connection after this response (`Connection: close`).
    pub close: bool,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
        param: Option<String>,
        code: Option<&'static str>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param,
            code,
            retry_after: None,
            close: false,
        }
    }

    /// 400: a request this server will never accept as it is.
    pub fn invalid(message: impl Into<String>, param: Option<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message,
            param,
            None,
        )
    }

    pub fn model_not_found(name: &str, served: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model '{name}' does not exist; this server runs '{served}'"),
            Some("model".into()),
            Some("model_not_found"),
        )
    }

    pub fn queue_full() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "the server's queue is full; retry after a second",
                None,
                Some("queue_full"),
            )
        }
    }

    pub fn shutting_down() -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is shutting down",
                None,
                Some("shutting_down"),
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            message,
            None,
            None,
        )
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong API key; send 'Authorization: Bearer <key>'",
            None,
            Some("invalid_api_key"),
        )
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.close {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}
