//! `tasks/outputs`: a Task's outputs through the cluster, with the
//! caller's permissions (`get` on `tasks/outputs`, checked as `tasks/log`
//! is). Without `path`, the list the Task's status holds; with it, the
//! object, streamed from the bucket through this server (the caller never
//! needs the bucket's address or credentials), its sha256 in
//! `x-k8s4r-sha256`.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use k8s4r_api::{OutputState, OutputStatus};
use kube::ResourceExt;
use serde::Deserialize;

use super::{authorize_as, status, task_named, LogsState, PeerName};

/// How long the server's own download URL is good for.
const URL_VALID: Duration = Duration::from_secs(300);

#[derive(Debug, Deserialize)]
pub(super) struct OutputsQuery {
    /// The output to download (as the Task lists it).
    path: Option<String>,
    /// Its attempt (default: the latest that has it).
    attempt: Option<u32>,
}

pub(super) async fn task_outputs(
    State(state): State<LogsState>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<OutputsQuery>,
    Extension(peer): Extension<PeerName>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize_as(
        &state,
        &peer,
        &headers,
        Some(&ns),
        &name,
        "tasks",
        "outputs",
        "get",
    )
    .await
    {
        return refused;
    }
    let task = match task_named(&state.client, &ns, &name).await {
        Ok(task) => task,
        Err(answer) => return answer,
    };
    // Only this Task's own objects: a key in its status that names another
    // (written by whoever may patch tasks/status) is not read.
    let job = task
        .labels()
        .get(k8s4r_api::names::LABEL_JOB)
        .map_or("-", String::as_str)
        .to_owned();
    let listed = task.status.map(|s| s.outputs).unwrap_or_default();
    let Some(path) = query.path else {
        return axum::Json(listed).into_response();
    };
    let output = match chosen(&listed, &path, query.attempt) {
        Ok(output) => output,
        Err(why) => return status(StatusCode::NOT_FOUND, "NotFound", format!("task {name}: {why}")),
    };
    let own = format!("{ns}/{job}/{name}/{}/", output.attempt);
    if !output.key.starts_with(&own) || output.key.contains("/../") {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "task {name}: output {path:?} names object {:?}, not one of its own",
                output.key
            ),
        );
    }
    let Some(bucket) = &state.bucket else {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "no bucket is configured for task outputs (k8s4r-server --outputs-endpoint)".into(),
        );
    };
    streamed(&state, bucket, output).await
}

/// The object of `output`, fetched from the bucket as it streams to the
/// caller, its sha256 in `x-k8s4r-sha256`.
async fn streamed(state: &LogsState, bucket: &crate::bucket::Bucket, output: &OutputStatus) -> Response {
    let url = bucket.download_url(&output.key, URL_VALID);
    let fetched = match state.http.get(url).send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            return status(
                StatusCode::BAD_GATEWAY,
                "BadGateway",
                format!("the bucket answered {} for {}", r.status(), output.key),
            )
        }
        Err(e) => {
            return status(
                StatusCode::BAD_GATEWAY,
                "BadGateway",
                format!("cannot reach the bucket: {e}"),
            )
        }
    };
    let mut answer = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/octet-stream")
        .header("x-k8s4r-sha256", output.sha256.as_str())
        .header("x-k8s4r-key", output.key.as_str());
    if let Some(len) = fetched.content_length() {
        answer = answer.header("content-length", len);
    }
    answer
        .body(Body::from_stream(fetched.bytes_stream()))
        .unwrap_or_else(|e| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()))
}

/// The output at `path` (of `attempt`, else the latest attempt listing
/// it), if it is uploaded; else why not.
fn chosen<'a>(
    listed: &'a [OutputStatus],
    path: &str,
    attempt: Option<u32>,
) -> Result<&'a OutputStatus, String> {
    let output = listed
        .iter()
        .filter(|o| o.path == path && attempt.is_none_or(|a| o.attempt == a))
        .max_by_key(|o| o.attempt)
        .ok_or_else(|| match attempt {
            Some(a) => format!("attempt {a} has no output {path:?}"),
            None => format!("no output {path:?}"),
        })?;
    match output.state {
        OutputState::Uploaded => Ok(output),
        OutputState::Uploading => Err(format!(
            "output {path:?} of attempt {} is still uploading",
            output.attempt
        )),
        OutputState::Dropped => Err(format!(
            "output {path:?} of attempt {} was dropped: {}",
            output.attempt,
            output.message.as_deref().unwrap_or("no reason given")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(attempt: u32, path: &str, state: OutputState) -> OutputStatus {
        OutputStatus {
            attempt,
            path: path.into(),
            state,
            message: Some("quota full".into()),
            ..OutputStatus::default()
        }
    }

    #[test]
    fn the_latest_uploaded_attempt_is_chosen_and_others_say_why_not() {
        let listed = [
            output(1, "a.bag", OutputState::Uploaded),
            output(2, "a.bag", OutputState::Uploaded),
            output(2, "b.bag", OutputState::Dropped),
            output(2, "c.bag", OutputState::Uploading),
        ];
        assert_eq!(chosen(&listed, "a.bag", None).unwrap().attempt, 2);
        assert_eq!(chosen(&listed, "a.bag", Some(1)).unwrap().attempt, 1);
        assert!(chosen(&listed, "b.bag", None)
            .unwrap_err()
            .contains("dropped: quota full"));
        assert!(chosen(&listed, "c.bag", None)
            .unwrap_err()
            .contains("still uploading"));
        assert!(chosen(&listed, "d.bag", None).unwrap_err().contains("no output"));
        assert!(chosen(&listed, "b.bag", Some(1))
            .unwrap_err()
            .contains("attempt 1 has no output"));
    }
}
