//! The server's bucket calls and the URLs it presigns, against a real S3
//! implementation (the embedded store `k8s4r up` serves): a multipart
//! upload whose parts go through presigned URLs only, as a robot sends
//! them, completed by the server, read back whole with its sha256.

mod support;

use std::time::Duration;

use k8s4r_server::bucket::{Bucket, BucketConfig, ObjectInfo};
use sha2::{Digest, Sha256};
use support::s3_store;

const PART: usize = 5 * 1024 * 1024;

fn bucket(endpoint: &str, secret: &str) -> Bucket {
    Bucket::new(&BucketConfig {
        endpoint: endpoint.into(),
        bucket: "outputs".into(),
        region: "us-east-1".into(),
        access_key: "k8s4r".into(),
        secret_key: secret.into(),
    })
    .expect("a bucket")
}

#[tokio::test]
async fn the_embedded_store_takes_an_upload_through_presigned_urls() {
    k8s4r_mqtt::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (config, stop) = s3_store(dir.path(), SECRET).await;
    let store = Bucket::new(&config).expect("a bucket");
    upload_and_read_back(&store).await;
    // A URL for one part sends nothing else (moto, below, checks no
    // signatures, so this is asked of the store only).
    let upload = store.start_upload("robots/rb1/a", "00").await.unwrap();
    let url = store.part_url("robots/rb1/a", &upload, 1, Duration::from_secs(60));
    let forged = url.replace("robots/rb1/a", "robots/rb2/a");
    let refused = reqwest::Client::new()
        .put(&forged)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403, "a signature covers its key");
    // A wrong key is refused, and said.
    let wrong = bucket(&config.endpoint, "not-the-secret-at-all");
    let error = wrong.start_upload("x", "00").await.unwrap_err().to_string();
    assert!(error.contains("refused to start an upload"), "{error}");
    stop.cancel();
}

#[tokio::test]
async fn moto_takes_the_same_upload() {
    k8s4r_mqtt::install_crypto_provider();
    let moto = tokio::task::spawn_blocking(|| k8s4r_testbed::moto::Moto::start("outputs"))
        .await
        .unwrap();
    upload_and_read_back(&bucket(&moto.endpoint, SECRET)).await;
}

const SECRET: &str = "s3cr3t-s3cr3t-s3cr3t";

/// A multipart upload whose parts go only through presigned URLs, as a
/// robot sends them, completed by the server and read back whole.
async fn upload_and_read_back(bucket: &Bucket) {
    let data: Vec<u8> = (0..2 * PART + 12345).map(|i| (i * 7 % 251) as u8).collect();
    let sha = format!("{:x}", Sha256::digest(&data));
    let key = "robots/rb1/default/job/job-g-0/1/out/run.bag";

    let upload = bucket.start_upload(key, &sha).await.expect("started");
    // The robot's side: plain PUTs to the URLs, no credentials.
    let http = reqwest::Client::new();
    let mut etags = Vec::new();
    for (i, chunk) in data.chunks(PART).enumerate() {
        let part = u16::try_from(i + 1).unwrap();
        let url = bucket.part_url(key, &upload, part, Duration::from_secs(60));
        assert!(!url.contains("s3cr3t"), "a URL never carries the secret");
        let answer = http.put(&url).body(chunk.to_vec()).send().await.expect("sent");
        assert!(answer.status().is_success(), "part {part}: {}", answer.status());
        let etag = answer.headers()["etag"].to_str().unwrap().to_owned();
        etags.push(etag);
    }
    bucket.complete(key, &upload, &etags).await.expect("completed");
    let info = bucket.head(key).await.expect("head");
    assert_eq!(
        info,
        Some(ObjectInfo {
            size: data.len() as u64,
            sha256: Some(sha.clone()),
        })
    );
    let got = http
        .get(bucket.download_url(key, Duration::from_secs(60)))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(format!("{:x}", Sha256::digest(&got)), sha);
    assert_eq!(bucket.head("robots/rb1/none").await.unwrap(), None);
}
