//! Calls to the API server: each under a timeout, each failure named after
//! what was being done, each write counted.

use std::future::Future;
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::metrics::ApiMetrics;
use crate::patch::Guarded;

/// A failed call to the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API server (or the way to it) answered with an error.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, with the object's name.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// No answer in time.
    #[error("{action}: no answer within {after:?}")]
    Timeout {
        /// What was being done.
        action: String,
        /// The timeout.
        after: Duration,
    },
}

impl ApiError {
    /// The HTTP status the API server answered, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Kube {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }

    /// A 409: someone else wrote first; re-read and decide again.
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    /// A 404: the object is gone.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// Whether trying again later may help: timeouts, transport errors,
    /// conflicts, throttling and server-side errors.
    pub fn is_transient(&self) -> bool {
        match self.code() {
            Some(code) => code == 409 || code == 429 || code >= 500,
            None => true,
        }
    }

    /// The outcome label of a failed call in the metrics.
    pub fn outcome(&self) -> &'static str {
        match (self, self.code()) {
            (_, Some(409)) => "conflict",
            (_, Some(404)) => "not_found",
            (ApiError::Timeout { .. }, _) => "timeout",
            _ => "error",
        }
    }
}

/// One program's way to the API server: its client, the timeout of every
/// call, the field manager of its writes, and where writes are counted.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    timeout: Duration,
    field_manager: &'static str,
    metrics: Option<ApiMetrics>,
}

impl Kube {
    /// Calls through `client`, each bounded by `timeout`, writing as
    /// `field_manager`.
    pub fn new(client: Client, timeout: Duration, field_manager: &'static str) -> Self {
        Self {
            client,
            timeout,
            field_manager,
            metrics: None,
        }
    }

    /// Counts every write, and its latency, in `metrics`.
    pub fn with_metrics(mut self, metrics: ApiMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The limit on every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The field manager of this program's writes.
    pub fn field_manager(&self) -> &'static str {
        self.field_manager
    }

    /// Patch parameters under this program's field manager.
    pub fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.field_manager.to_owned()),
            ..PatchParams::default()
        }
    }

    /// Create and replace parameters under this program's field manager.
    pub fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(self.field_manager.to_owned()),
            ..PostParams::default()
        }
    }

    /// Runs a read under the timeout; `action` names it in the error.
    pub async fn read<T>(
        &self,
        action: impl FnOnce() -> String,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, ApiError> {
        self.bounded(None, action, call).await
    }

    /// Runs a write under the timeout and counts it as `write`.
    pub async fn write<T>(
        &self,
        write: &'static str,
        action: impl FnOnce() -> String,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, ApiError> {
        self.bounded(Some(write), action, call).await
    }

    async fn bounded<T>(
        &self,
        write: Option<&'static str>,
        action: impl FnOnce() -> String,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, ApiError> {
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(ApiError::Kube {
                action: action(),
                source,
            }),
            Err(_) => Err(ApiError::Timeout {
                action: action(),
                after: self.timeout,
            }),
        };
        if let (Some(write), Some(metrics)) = (write, &self.metrics) {
            let outcome = result.as_ref().map_or_else(ApiError::outcome, |_| "ok");
            metrics.observe(write, outcome, started.elapsed());
        }
        result
    }

    /// Merge-patches the status of `name`. With `resource_version`, the
    /// patch applies only to that version (a 409 otherwise), for decisions
    /// that depend on what was read.
    pub async fn patch_status<K, S>(
        &self,
        write: &'static str,
        api: &Api<K>,
        name: &str,
        resource_version: Option<&str>,
        status: &S,
        action: impl FnOnce() -> String,
    ) -> Result<K, ApiError>
    where
        K: Clone + DeserializeOwned + std::fmt::Debug,
        S: Serialize + std::fmt::Debug,
    {
        let body = Guarded::status(resource_version, status);
        let params = self.patch_params();
        self.write(
            write,
            action,
            api.patch_status(name, &params, &Patch::Merge(&body)),
        )
        .await
    }

    /// Merge-patches `name` (metadata or spec) with `body`, guarded like
    /// [`Kube::patch_status`].
    pub async fn patch<K, B>(
        &self,
        write: &'static str,
        api: &Api<K>,
        name: &str,
        body: &B,
        action: impl FnOnce() -> String,
    ) -> Result<K, ApiError>
    where
        K: Clone + DeserializeOwned + std::fmt::Debug,
        B: Serialize + std::fmt::Debug,
    {
        let params = self.patch_params();
        self.write(write, action, api.patch(name, &params, &Patch::Merge(body)))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> ApiError {
        ApiError::Kube {
            action: "patching task t".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("boom", "Reason")
                    .with_code(code)
                    .boxed(),
            ),
        }
    }

    #[test]
    fn errors_say_what_was_done_and_whether_to_retry() {
        let conflict = api_error(409);
        assert!(conflict.is_conflict() && conflict.is_transient());
        assert_eq!(conflict.outcome(), "conflict");
        assert!(api_error(404).is_not_found() && !api_error(404).is_transient());
        assert!(api_error(503).is_transient());
        assert!(!api_error(422).is_transient());
        let timeout = ApiError::Timeout {
            action: "reading robot r".into(),
            after: Duration::from_secs(2),
        };
        assert!(timeout.is_transient());
        assert_eq!(timeout.outcome(), "timeout");
        assert_eq!(timeout.to_string(), "reading robot r: no answer within 2s");
    }
}
