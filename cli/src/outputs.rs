//! `k8s4r outputs TASK`: the files a task's robot uploaded (from the
//! Task's status), and `--get PATH` to download one through the cluster
//! (the logs API's `tasks/outputs`, which takes `get` on `tasks/outputs`
//! in API group logs.k8s4r.io and fetches the object from the bucket).
//! A download is checked against the sha256 the robot read; one that is
//! cut short or differs is an error, and no file is left in its place.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s4r_api::{OutputState, OutputStatus, Task};
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use crate::operate::KubeArgs;

/// `k8s4r outputs`.
#[derive(Debug, Clone, ClapArgs)]
pub struct OutputsArgs {
    /// The Task.
    pub task: String,
    /// Download this output (its path as listed) instead of listing.
    #[arg(long, value_name = "PATH")]
    pub get: Option<String>,
    /// With --get: of this attempt (default: the latest that has it).
    #[arg(long, requires = "get")]
    pub attempt: Option<u32>,
    /// With --get: write it here (default: its file name in the current
    /// directory; `-` for standard output).
    #[arg(short, long, requires = "get")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub kube: KubeArgs,
}

pub async fn run(args: OutputsArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (client, ns) = args.kube.connect(data_dir).await?;
    match &args.get {
        None => {
            let tasks: Api<Task> = Api::namespaced(client, &ns);
            let task = tasks
                .get_opt(&args.task)
                .await
                .with_context(|| format!("reading task {} in namespace {ns}", args.task))?
                .with_context(|| format!("task {} not found in namespace {ns}", args.task))?;
            let listed = task.status.map(|s| s.outputs).unwrap_or_default();
            print!("{}", table(&listed));
            Ok(())
        }
        Some(path) => {
            let to = match &args.output {
                Some(p) => p.clone(),
                None => PathBuf::from(Path::new(path).file_name().context("the path names no file")?),
            };
            download(&client, &ns, &args.task, path, args.attempt, &to).await
        }
    }
}

/// The list, as `kubectl get` prints one.
pub fn table(listed: &[OutputStatus]) -> String {
    if listed.is_empty() {
        return "No outputs.\n".to_owned();
    }
    let mut rows = vec![[
        "ATTEMPT".to_owned(),
        "PATH".to_owned(),
        "SIZE".to_owned(),
        "STATE".to_owned(),
        "KEY OR REASON".to_owned(),
    ]];
    for o in listed {
        let state = match o.state {
            OutputState::Uploading => "Uploading",
            OutputState::Uploaded => "Uploaded",
            OutputState::Dropped => "Dropped",
        };
        let detail = match o.state {
            OutputState::Dropped => o.message.clone().unwrap_or_default(),
            _ => o.key.clone(),
        };
        rows.push([
            o.attempt.to_string(),
            o.path.clone(),
            o.size.to_string(),
            state.to_owned(),
            detail,
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 4 {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// An output as the cluster sends it.
pub struct Download {
    /// The sha256 the robot read, to check the bytes against.
    pub sha256: Option<String>,
    pub size: Option<u64>,
    pub body: std::pin::Pin<Box<dyn futures::Stream<Item = anyhow::Result<bytes::Bytes>> + Send>>,
}

/// Asks the logs API for output `path` of task `name` (of `attempt`, else
/// the latest that has it).
pub async fn open(
    client: &Client,
    ns: &str,
    name: &str,
    path: &str,
    attempt: Option<u32>,
) -> anyhow::Result<Download> {
    let mut pairs = vec![("path", path.to_owned())];
    if let Some(a) = attempt {
        pairs.push(("attempt", a.to_string()));
    }
    let query = crate::reach::query_of(&pairs);
    let uri = format!("/apis/logs.k8s4r.io/v1alpha1/namespaces/{ns}/tasks/{name}/outputs?{query}");
    let request = http::Request::get(&uri)
        .body(kube::client::Body::empty())
        .context("building the request")?;
    let response = client
        .send(request)
        .await
        .context("asking the API server for the output")?;
    let status = response.status();
    let headers = response.headers().clone();
    let header = |h: &str| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (sha256, size) = (
        header("x-k8s4r-sha256"),
        header("content-length").and_then(|l| l.parse::<u64>().ok()),
    );
    drop(headers);
    let mut body = response.into_body().into_data_stream();
    if !status.is_success() {
        let message = crate::logs::refusal_message(&mut body).await?;
        bail!("{}", refusal(status.as_u16(), &message, name, ns));
    }
    Ok(Download {
        sha256,
        size,
        body: Box::pin(body.map(|c| c.map_err(|e| anyhow::anyhow!("the download was cut: {e}")))),
    })
}

/// Downloads output `path` of task `name` into `to` (`-`: stdout),
/// checking its sha256.
pub async fn download(
    client: &Client,
    ns: &str,
    name: &str,
    path: &str,
    attempt: Option<u32>,
    to: &Path,
) -> anyhow::Result<()> {
    let Download {
        sha256: want,
        mut body,
        ..
    } = open(client, ns, name, path, attempt).await?;
    let stdout = to == Path::new("-");
    // Written beside its place, then renamed: a cut download leaves nothing.
    let partial = to.with_extension("k8s4r-partial");
    let mut out: Box<dyn Write> = if stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&partial).with_context(|| format!("cannot write {}", partial.display()))?,
        )
    };
    let mut hasher = Sha256::new();
    let written = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            out.write_all(&chunk).context("writing the output")?;
        }
        out.flush().context("writing the output")?;
        let got = hex(&hasher.finalize());
        match &want {
            Some(want) if *want != got => {
                bail!("the download's sha256 is {got}, not {want} as the robot read it")
            }
            _ => Ok(()),
        }
    }
    .await;
    drop(out);
    if stdout {
        return written;
    }
    match written {
        Ok(()) => std::fs::rename(&partial, to).with_context(|| format!("cannot write {}", to.display())),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// What a refusal means for a person.
fn refusal(code: u16, message: &str, name: &str, ns: &str) -> String {
    match code {
        403 => format!(
            "you may not read the outputs of task {name} in namespace {ns}: it takes `get` on `tasks/outputs` in API group logs.k8s4r.io ({message})"
        ),
        404 => message.to_owned(),
        _ => format!("{message} (HTTP {code})"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_says_key_or_reason() {
        let listed = [
            OutputStatus {
                attempt: 1,
                path: "bags/run.mcap".into(),
                size: 200,
                key: "default/j/t/1/rb/bags/run.mcap".into(),
                state: OutputState::Uploaded,
                ..OutputStatus::default()
            },
            OutputStatus {
                attempt: 1,
                path: "b.bin".into(),
                size: 7,
                state: OutputState::Dropped,
                message: Some("quota full".into()),
                ..OutputStatus::default()
            },
        ];
        let t = table(&listed);
        assert!(
            t.starts_with("ATTEMPT   PATH            SIZE   STATE      KEY OR REASON\n"),
            "{t}"
        );
        assert!(
            t.contains("1         b.bin           7      Dropped    quota full"),
            "{t}"
        );
        assert_eq!(table(&[]), "No outputs.\n");
    }
}
