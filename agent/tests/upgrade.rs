//! Agent upgrades on the robot: the real agent binary served over HTTP,
//! signed with a fresh minisign key, prepared into its slot and switched to
//! on trial; and refused, with nothing switched, when any check fails.

use std::path::Path;
use std::time::Duration;

use k8s4r_agent::supervisor::artifacts::{client, Limits};
use k8s4r_agent::upgrade::prepare::{prepare, Order, Step};
use k8s4r_agent::upgrade::slots::{BootCheck, Slots};
use k8s4r_agent::upgrade::verify::{subject, Trust};
use k8s4r_testbed::http::{serve, Reply};
use sha2::{Digest, Sha256};

const AGENT: &str = env!("CARGO_BIN_EXE_k8s4r-agent");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn limits() -> Limits {
    Limits {
        max_bytes: 1 << 30,
        timeout: Duration::from_secs(60),
        retries: 1,
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    slots: Slots,
    old: std::path::PathBuf,
    key: minisign::KeyPair,
    binary: Vec<u8>,
}

/// A robot whose agent "0.0.1" was installed in its slots.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let slots = Slots::new(dir.path());
    let placeholder = dir.path().join("old-agent");
    std::fs::write(&placeholder, b"the old agent").unwrap();
    let old = slots.install("0.0.1", &placeholder).unwrap();
    Fixture {
        _dir: dir,
        slots,
        old,
        key: minisign::KeyPair::generate_unencrypted_keypair().unwrap(),
        binary: std::fs::read(AGENT).unwrap(),
    }
}

impl Fixture {
    fn sign(&self, comment: &str) -> String {
        minisign::sign(
            Some(&self.key.pk),
            &self.key.sk,
            self.binary.as_slice(),
            Some(comment),
            None,
        )
        .unwrap()
        .into_string()
    }
    fn trust(&self) -> Trust {
        Trust::Keys(vec![self.key.pk.to_base64()])
    }
    fn order(&self, url: String, signature: Option<String>) -> Order {
        Order {
            rollout: "r1".into(),
            version: VERSION.into(),
            url,
            sha256: Sha256::digest(&self.binary)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            signature,
            health_timeout: Duration::from_secs(60),
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[tokio::test]
async fn a_signed_agent_is_staged_and_switched_to_on_trial() {
    let f = fixture();
    let base = serve(vec![("/agent", Reply::Body(f.binary.clone()))]).await;
    let order = f.order(
        format!("{base}/agent"),
        Some(f.sign(&subject(VERSION, std::env::consts::ARCH))),
    );
    let steps = std::sync::Mutex::new(Vec::new());
    let trial = prepare(
        &order,
        &f.slots,
        &f.trust(),
        &client().unwrap(),
        limits(),
        |s| steps.lock().unwrap().push(s),
        || Ok(()),
    )
    .await
    .expect("prepared");
    assert_eq!(
        *steps.lock().unwrap(),
        [Step::Downloading, Step::Staged, Step::Restarting]
    );
    let current = f.slots.current().unwrap();
    assert_eq!(current, trial.to);
    assert!(
        same_file(&current, Path::new(AGENT)),
        "the slot holds the served binary"
    );
    assert_eq!(
        f.slots.confirmed(),
        Some(f.old.clone()),
        "the old binary stays the confirmed one"
    );
    assert!(matches!(
        f.slots.boot_check(std::time::SystemTime::now()).unwrap(),
        BootCheck::OnTrial(_)
    ));
    let again = prepare(
        &order,
        &f.slots,
        &f.trust(),
        &client().unwrap(),
        limits(),
        |_| {},
        || Ok(()),
    )
    .await;
    assert!(again.unwrap_err().contains("still on trial"));
}

#[tokio::test]
async fn a_binary_that_fails_a_check_switches_nothing() {
    let f = fixture();
    let base = serve(vec![("/agent", Reply::Body(f.binary.clone()))]).await;
    let url = format!("{base}/agent");
    let good = f.sign(&subject(VERSION, std::env::consts::ARCH));
    let other_key = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let by_stranger = minisign::sign(
        None,
        &other_key.sk,
        f.binary.as_slice(),
        Some(&subject(VERSION, std::env::consts::ARCH)),
        None,
    )
    .unwrap()
    .into_string();
    let mut wrong_sha = f.order(url.clone(), Some(good.clone()));
    wrong_sha.sha256 = "ab".repeat(32);
    let mut wrong_version = f.order(url.clone(), Some(good.clone()));
    wrong_version.version = "9.9.9".into();
    let cases = [
        (
            f.order(url.clone(), Some(by_stranger)),
            f.trust(),
            "signature does not verify",
        ),
        (wrong_sha, f.trust(), "sha256"),
        (wrong_version, f.trust(), "vouches for"),
        (f.order(url.clone(), None), f.trust(), "no signature"),
        (
            f.order(url.clone(), Some(good.clone())),
            Trust::Nothing,
            "pins no upgrade key",
        ),
        (f.order(format!("{base}/missing"), Some(good)), f.trust(), "404"),
    ];
    for (order, trust, why) in cases {
        let refused = prepare(
            &order,
            &f.slots,
            &trust,
            &client().unwrap(),
            limits(),
            |_| {},
            || Ok(()),
        )
        .await
        .expect_err(why);
        assert!(refused.contains(why), "{why}: {refused}");
        assert_eq!(f.slots.current(), Some(f.old.clone()), "{why}: nothing switched");
        assert_eq!(f.slots.trial(), None, "{why}");
    }
}

#[tokio::test]
async fn an_agent_not_installed_in_slots_is_not_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture();
    let order = f.order("http://127.0.0.1:9/agent".into(), None);
    let refused = prepare(
        &order,
        &Slots::new(dir.path()),
        &Trust::UnsignedAllowed,
        &client().unwrap(),
        limits(),
        |_| {},
        || Ok(()),
    )
    .await
    .unwrap_err();
    assert!(
        refused.contains("install it once with systemd/install.sh"),
        "{refused}"
    );
}
