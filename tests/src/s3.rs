//! The S3-compatible server `tests/run` starts (moto on loopback), as the tests see it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Where the test S3 server is and the environment a den process needs to reach it.
pub struct TestS3 {
    pub endpoint: String,
    pub bucket: String,
    /// `AWS_*` variables for a child process: the endpoint and the test credentials.
    pub env: [(&'static str, String); 4],
}

impl TestS3 {
    /// The server named by `DEN_TEST_S3_ENDPOINT` (and `DEN_TEST_S3_BUCKET`, default
    /// `den-test`), or `None` when it is not set: the caller reports it through
    /// [`crate::environment::missing`] (a failure under tests/run, which always sets it).
    pub fn from_env() -> Option<TestS3> {
        let endpoint = std::env::var("DEN_TEST_S3_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty())?;
        let var = |k: &str, d: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| d.into())
        };
        let bucket = var("DEN_TEST_S3_BUCKET", "den-test");
        let env = [
            ("AWS_ENDPOINT_URL", endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", var("AWS_ACCESS_KEY_ID", "testing")),
            (
                "AWS_SECRET_ACCESS_KEY",
                var("AWS_SECRET_ACCESS_KEY", "testing"),
            ),
            ("AWS_REGION", var("AWS_REGION", "us-east-1")),
        ];
        Some(TestS3 {
            endpoint,
            bucket,
            env,
        })
    }

    /// A key prefix no other run uses (`NAME-<nanoseconds>`), so runs never see each
    /// other's objects.
    pub fn fresh_prefix(name: &str) -> String {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{name}-{nanos}")
    }
}
