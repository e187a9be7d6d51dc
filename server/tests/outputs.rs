//! Task outputs through the server, with a scripted robot and a real S3
//! store (the embedded one): the robot asks, gets presigned URLs, sends
//! the parts itself, and the server completes the object and lists it in
//! the Task's status; asks it must not serve are refused, saying why.

mod support;

use std::time::Duration;

use k8s4r_api::protocol::decode;
use k8s4r_api::protocol::outputs::{Answer, OutputAnswer, OutputAsk, Want};
use k8s4r_api::{OutputState, RobotPhase, TaskState};
use k8s4r_server::bucket::Bucket;
use sha2::{Digest, Sha256};
use support::{eventually, s3_store, Env, FakeRobot};

const PART: u64 = 5 * 1024 * 1024;
const SECRET: &str = "outputs-secret-never-on-a-robot";

fn ask(uid: &str, robot: &str, data: &[u8], want: Want) -> OutputAsk {
    OutputAsk {
        v: 1,
        robot_id: robot.into(),
        task_uid: uid.into(),
        attempt: 1,
        path: "out/run.bag".into(),
        size: data.len() as u64,
        sha256: format!("{:x}", Sha256::digest(data)),
        part_size: PART,
        want,
    }
}

async fn answer(robot: &mut FakeRobot) -> OutputAnswer {
    decode(&robot.expect("/outputs/answer").await).expect("an answer")
}

/// The robot's part of an upload: plain PUTs of `data`, a part per URL;
/// the parts' ETags.
async fn put_parts(urls: &[k8s4r_api::protocol::outputs::PartUrl], data: &[u8]) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut etags = Vec::new();
    for (u, chunk) in urls.iter().zip(data.chunks(PART as usize)) {
        let sent = http.put(&u.url).body(chunk.to_vec()).send().await.unwrap();
        assert!(sent.status().is_success(), "{}", sent.status());
        etags.push(sent.headers()["etag"].to_str().unwrap().to_owned());
    }
    etags
}

/// Task `name`'s first output, once it is listed in `state`.
async fn listed_as(env: &Env, name: &str, state: OutputState) -> k8s4r_api::OutputStatus {
    eventually(&format!("the output listed as {state:?}"), || async {
        let s = env.task(name).await?.status?;
        s.outputs.first().filter(|o| o.state == state).cloned()
    })
    .await
}

/// Checks that the bucket holds `data` whole under `key`, with its sha256.
async fn in_bucket(config: &k8s4r_server::bucket::BucketConfig, key: &str, sha256: &str, data: &[u8]) {
    let bucket = Bucket::new(config).unwrap();
    let info = bucket.head(key).await.unwrap().expect("the object");
    assert_eq!(info.sha256.as_deref(), Some(sha256));
    let read = reqwest::get(bucket.download_url(key, Duration::from_secs(60)))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&read[..], data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_robot_uploads_an_output_through_urls_and_the_task_lists_it() {
    k8s4r_mqtt::install_crypto_provider();
    let env = Env::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (bucket_config, stop) = s3_store(dir.path(), SECRET).await;
    let mut config = env.config();
    config.outputs = Some(bucket_config.clone());
    let server = env.server_with(config).await;
    let (mut robot, uid) = env.dispatched_to("rb1", "job-a-0").await;
    env.move_task("job-a-0", "rb1", TaskState::Completed, 1).await;

    let data: Vec<u8> = (0..2 * PART + 777).map(|i| (i % 253) as u8).collect();
    let topic = robot.topics.output_ask("rb1");
    let first = Want::Parts {
        upload_id: None,
        parts: vec![1, 2, 3],
    };
    robot.send(topic.clone(), &ask(&uid, "rb1", &data, first)).await;
    let got = answer(&mut robot).await;
    let Answer::Parts {
        key,
        upload_id,
        urls,
        valid_ms,
    } = got.answer
    else {
        panic!("no URLs: {got:?}");
    };
    assert_eq!(key, "default/-/job-a-0/1/rb1/out/run.bag");
    assert!(valid_ms >= 60_000, "{valid_ms}");
    assert_eq!(urls.len(), 3);
    for u in &urls {
        assert!(!u.url.contains(SECRET), "a URL carries the bucket's secret");
    }
    let etags = put_parts(&urls, &data).await;
    let listed = listed_as(&env, "job-a-0", OutputState::Uploading).await;
    assert_eq!(listed.key, key);
    assert_eq!(listed.size, data.len() as u64);

    let complete = Want::Complete {
        upload_id: upload_id.clone(),
        etags: etags.clone(),
    };
    robot
        .send(topic.clone(), &ask(&uid, "rb1", &data, complete.clone()))
        .await;
    let got = answer(&mut robot).await;
    assert_eq!(got.answer, Answer::Completed { key: key.clone() });
    let done = listed_as(&env, "job-a-0", OutputState::Uploaded).await;
    assert_eq!(done.sha256, format!("{:x}", Sha256::digest(&data)));
    in_bucket(&bucket_config, &key, &done.sha256, &data).await;
    // A completion asked again (its answer was lost) is answered the same.
    robot
        .send(topic.clone(), &ask(&uid, "rb1", &data, complete))
        .await;
    assert_eq!(answer(&mut robot).await.answer, Answer::Completed { key });

    // Another robot may not upload this attempt's outputs.
    let mut other = FakeRobot::connect(&env.broker, "rb2").await;
    other.registered(&env).await;
    env.set_phase("rb2", RobotPhase::Online).await;
    let theirs = Want::Parts {
        upload_id: None,
        parts: vec![1],
    };
    other
        .send(other.topics.output_ask("rb2"), &ask(&uid, "rb2", &data, theirs))
        .await;
    let refused = answer(&mut other).await;
    let Answer::Refused { reason, retry } = refused.answer else {
        panic!("{refused:?}");
    };
    assert!(!retry && reason.contains("did not run on robot rb2"), "{reason}");
    server.stop().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_bucket_the_robot_is_told_so() {
    let env = Env::start().await;
    let server = env.server().await;
    let (mut robot, uid) = env.dispatched_to("rb1", "job-a-0").await;
    let want = Want::Parts {
        upload_id: None,
        parts: vec![1],
    };
    robot
        .send(robot.topics.output_ask("rb1"), &ask(&uid, "rb1", b"hello", want))
        .await;
    let got = answer(&mut robot).await;
    let Answer::Refused { reason, retry } = got.answer else {
        panic!("{got:?}");
    };
    assert!(!retry);
    assert!(reason.contains("no bucket is configured"), "{reason}");
    server.stop().await;
}
