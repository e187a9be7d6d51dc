//! The object store `k8s4r up` serves when no bucket is named, so that
//! task outputs need nothing else installed: the S3 API, as the `s3s`
//! crates implement it (`s3s` for the protocol and SigV4, presigned URLs
//! included; `s3s-fs` keeping objects as files under a directory), on one
//! address, behind one access key.
//!
//! Chosen over writing one: `s3s` is a maintained implementation of the
//! S3 protocol in Rust (multipart uploads, presigned URLs, object
//! metadata), `s3s-fs` its file-system backend; a bucket is a directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What a store is served with.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where objects are kept: a directory per bucket.
    pub root: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// The bucket to have (made if missing).
    pub bucket: String,
    /// The one key that may use it.
    pub access_key: String,
    pub secret_key: String,
}

/// A store that is serving.
#[derive(Debug, Clone)]
pub struct Served {
    /// Its endpoint, `http://ADDR`.
    pub endpoint: String,
    pub addr: SocketAddr,
}

/// Serves `config` until `shutdown`; returns once it listens.
pub async fn serve(config: StoreConfig, shutdown: CancellationToken) -> anyhow::Result<Served> {
    make_bucket(&config.root, &config.bucket)?;
    let fs = s3s_fs::FileSystem::new(&config.root)
        .map_err(|e| anyhow::anyhow!("the object store at {}: {e:?}", config.root.display()))?;
    let service = {
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(
            config.access_key.clone(),
            config.secret_key.clone(),
        ));
        builder.build()
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} for the object store", config.listen))?;
    let addr = listener.local_addr().context("the object store's address")?;
    tokio::spawn(async move {
        let http = ConnBuilder::new(TokioExecutor::new());
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            let socket = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((socket, _)) => socket,
                    Err(error) => {
                        tracing::warn!(%error, "the object store could not accept a connection");
                        continue;
                    }
                },
                () = shutdown.cancelled() => break,
            };
            let connection = http.serve_connection(TokioIo::new(socket), service.clone());
            let connection = graceful.watch(connection.into_owned());
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
        graceful.shutdown().await;
    });
    Ok(Served {
        endpoint: format!("http://{addr}"),
        addr,
    })
}

/// A bucket is a directory under the root.
fn make_bucket(root: &Path, bucket: &str) -> anyhow::Result<()> {
    let valid = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !bucket.starts_with(['-', '.']);
    anyhow::ensure!(
        valid,
        "{bucket:?} is not a bucket name (3 to 63 of a-z, 0-9, '-', '.')"
    );
    let dir = root.join(bucket);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(())
}
