//! `k8s4r image push`: a container image onto robots through the cluster,
//! for robots that cannot reach a registry. The image goes as an OCI
//! archive over each robot's own connection (an exec session on the
//! robot, as `k8s4r cp` goes), within the robot's session rate, into its
//! podman store. A push cut short resumes: the robot says how much of the
//! archive it has, and only the rest is sent.
//!
//! The archive is made once per image digest with skopeo (which keeps the
//! manifest, so the image keeps the digest tasks name it by) and kept in
//! k8s4r's data directory for the next push.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use futures::{SinkExt, StreamExt};
use k8s4r_api::container::ImageRef;
use kube::api::{Api, ListParams};
use kube::Client;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_tungstenite::tungstenite::Message;

use crate::operate::KubeArgs;
use crate::reach::{connect, exit_code_of, query_of, received, Target, STATUS, STDERR, STDIN, STDOUT};

/// Bytes read from the archive at a time.
const CHUNK: usize = 32 * 1024;

/// `k8s4r image`.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Copy a container image to robots through the cluster, into their
    /// podman store, resumably and within each robot's session rate:
    /// `k8s4r image push robot/NAME IMAGE`, or `-l SELECTOR IMAGE` for
    /// every robot the selector matches. IMAGE is a reference by digest
    /// (`registry/name@sha256:...`, read with skopeo from the registry, or
    /// from the local podman store with `containers-storage:` before it),
    /// or give an OCI archive with --archive.
    Push(PushArgs),
}

/// `k8s4r image push`.
#[derive(Debug, Clone, ClapArgs)]
pub struct PushArgs {
    /// `robot/NAME IMAGE`, or `IMAGE` with --selector.
    #[arg(num_args = 0..=2)]
    pub args: Vec<String>,
    /// Every robot whose labels match (`site=lab,model=r2`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// An OCI archive to push instead of an image reference.
    #[arg(long, conflicts_with = "src_tls_verify")]
    pub archive: Option<PathBuf>,
    /// Check the source registry's TLS certificate (false only for a
    /// registry over plain HTTP).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub src_tls_verify: bool,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Runs `k8s4r image ...`.
pub async fn run(command: ImageCommand, data_dir: &Path) -> anyhow::Result<()> {
    match command {
        ImageCommand::Push(args) => push(args, data_dir).await,
    }
}

async fn push(args: PushArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (robot, image) = match (&args.selector, args.args.as_slice(), &args.archive) {
        (Some(_), [], Some(_)) => (None, None),
        (Some(_), [image], None) => (None, Some(image.clone())),
        (None, [robot], Some(_)) => (Some(robot.clone()), None),
        (None, [robot, image], None) => (Some(robot.clone()), Some(image.clone())),
        _ => bail!("name the robots (robot/NAME, or -l SELECTOR) and the image (IMAGE, or --archive FILE)"),
    };
    let (client, ns) = args.kube.connect(data_dir).await?;
    let robots = match (robot, &args.selector) {
        (Some(robot), _) => match robot.parse::<Target>().map_err(anyhow::Error::msg)? {
            Target::Robot(name) => vec![name],
            Target::Task(_) => bail!("{robot:?}: images go to robots (robot/NAME)"),
        },
        (None, Some(selector)) => robots_matching(&client, selector).await?,
        (None, None) => unreachable!("checked above"),
    };
    // The image the robot must hold afterwards, by digest (an archive
    // given as is is loaded as is).
    let (archive, pinned) = match (&args.archive, image) {
        (Some(archive), _) => (archive.clone(), None),
        (None, Some(image)) => {
            let (archive, pinned) = archive_of(&image, args.src_tls_verify, data_dir).await?;
            (archive, Some(pinned))
        }
        (None, None) => unreachable!("checked above"),
    };
    let (sha256, length) = digest_of(&archive).await?;
    let mut failed = Vec::new();
    for name in &robots {
        match push_to(&client, &ns, name, &archive, (&sha256, length), pinned.as_deref()).await {
            Ok(report) => println!("robot/{name}: {report}"),
            Err(e) => {
                eprintln!("robot/{name}: {e:#}");
                failed.push(name.clone());
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "the image did not reach {} of {} robots ({}); push again to resume",
            failed.len(),
            robots.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// The names of the robots `selector` matches; none is an error.
async fn robots_matching(client: &Client, selector: &str) -> anyhow::Result<Vec<String>> {
    let api: Api<k8s4r_api::Robot> = Api::all(client.clone());
    let list = api
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("listing the robots that match {selector:?}"))?;
    let names: Vec<String> = list.items.into_iter().filter_map(|r| r.metadata.name).collect();
    if names.is_empty() {
        bail!("no robot matches {selector:?}");
    }
    Ok(names)
}

/// The OCI archive of `image`, made with skopeo once per digest and kept
/// in the data directory, and the image by digest.
async fn archive_of(image: &str, tls_verify: bool, data_dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let (transport, reference) = match image.strip_prefix("containers-storage:") {
        Some(rest) => ("containers-storage:", rest),
        None => ("docker://", image.strip_prefix("docker://").unwrap_or(image)),
    };
    let parsed = ImageRef::parse(reference).map_err(|why| anyhow::anyhow!("image {reference:?}: {why}"))?;
    let dir = data_dir.join("images");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let hex = parsed.digest.trim_start_matches("sha256:");
    let archive = dir.join(format!("{hex}.oci.tar"));
    if archive.exists() {
        return Ok((archive, parsed.pinned()));
    }
    let part = dir.join(format!("{hex}.oci.tar.part"));
    let _ = std::fs::remove_file(&part);
    // The archive names the image as tasks do (the tag, if any, is kept
    // as its name in the robot's store).
    let named = format!(
        "{}:{}",
        parsed.name,
        parsed.tag.as_deref().unwrap_or("k8s4r-pushed")
    );
    let mut skopeo = tokio::process::Command::new("skopeo");
    // The manifest as it is, or no archive: an archive whose image got
    // another digest on the way would load under a digest no task names.
    skopeo.args(["copy", "--quiet", "--preserve-digests"]);
    if transport == "docker://" {
        skopeo.arg(format!("--src-tls-verify={tls_verify}"));
    }
    skopeo
        .arg(format!("{transport}{}", parsed.pinned()))
        .arg(format!("oci-archive:{}:{named}", part.display()));
    let out = skopeo.output().await.map_err(|e| {
        anyhow::anyhow!("cannot run skopeo ({e}): install it (Debian: apt-get install skopeo), or give an OCI archive with --archive")
    })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&part);
        bail!(
            "skopeo could not read {image}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    std::fs::rename(&part, &archive).with_context(|| format!("keeping {}", archive.display()))?;
    Ok((archive, parsed.pinned()))
}

/// The archive's sha256 (hex) and length.
async fn digest_of(archive: &Path) -> anyhow::Result<(String, u64)> {
    let mut file = tokio::fs::File::open(archive)
        .await
        .with_context(|| format!("opening {}", archive.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut length = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        length += n as u64;
    }
    if length == 0 {
        bail!("{} is empty", archive.display());
    }
    Ok((format!("{:x}", hasher.finalize()), length))
}

/// Pushes the archive to one robot; what it did, for a person.
async fn push_to(
    client: &Client,
    ns: &str,
    robot: &str,
    archive: &Path,
    (sha256, length): (&str, u64),
    image: Option<&str>,
) -> anyhow::Result<String> {
    let target = Target::Robot(robot.to_owned());
    let mut pairs = vec![("loadImage", sha256.to_owned()), ("length", length.to_string())];
    if let Some(image) = image {
        pairs.push(("image", image.to_owned()));
    }
    let query = query_of(&pairs);
    let ws = connect(client, &target, ns, "exec", &query).await?;
    let (mut sink, mut stream) = ws.split();
    let early = "the push ended early (the connection was lost); push again to resume";
    // The robot says first how much of the archive it has.
    let mut said = Vec::new();
    let have = loop {
        let Some((channel, body)) = received(stream.next().await, "push", early)? else {
            continue;
        };
        match channel {
            STDOUT => said.extend_from_slice(&body),
            STDERR => bail!("{}", String::from_utf8_lossy(&body).trim()),
            STATUS => bail!(
                "the robot ended the push at once: {}",
                String::from_utf8_lossy(&body)
            ),
            _ => {}
        }
        if let Some(end) = said.iter().position(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(&said[..end]).into_owned();
            said.drain(..=end);
            break line
                .strip_prefix("have ")
                .and_then(|n| n.trim().parse::<u64>().ok())
                .filter(|n| *n <= length)
                .ok_or_else(|| anyhow::anyhow!("the robot answered {line:?}"))?;
        }
    };
    let mut file = tokio::fs::File::open(archive).await?;
    file.seek(SeekFrom::Start(have)).await?;
    let mut buf = vec![0u8; CHUNK];
    let mut reading = have < length;
    let mut errors = Vec::new();
    loop {
        tokio::select! {
            n = file.read(&mut buf), if reading => {
                let n = n.with_context(|| format!("reading {}", archive.display()))?;
                if n == 0 {
                    reading = false;
                    continue;
                }
                let mut message = Vec::with_capacity(n + 1);
                message.push(STDIN);
                message.extend_from_slice(&buf[..n]);
                sink.send(Message::Binary(message.into())).await.context(early)?;
            }
            message = stream.next() => {
                let Some((channel, body)) = received(message, "push", early)? else { continue };
                match channel {
                    STDOUT => said.extend_from_slice(&body),
                    STDERR => errors.extend_from_slice(&body),
                    STATUS => {
                        let code = exit_code_of(&body)?;
                        if code != 0 {
                            bail!("{} (exit status {code})", String::from_utf8_lossy(&errors).trim());
                        }
                        let loaded = String::from_utf8_lossy(&said).trim().to_owned();
                        return Ok(format!(
                            "loaded {} ({} bytes sent, {have} of {length} were already there)",
                            if loaded.is_empty() { "the image".to_owned() } else { loaded },
                            length - have
                        ));
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_archives_digest_is_its_sha256_and_length() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.tar");
        std::fs::write(&file, b"abc").unwrap();
        let (sha, len) = digest_of(&file).await.unwrap();
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(len, 3);
        std::fs::write(&file, b"").unwrap();
        assert!(digest_of(&file).await.is_err());
    }
}
