//! Whether a downloaded agent binary may be staged: its sha256, its
//! minisign signature against a key this robot pins, the version and
//! architecture the signature vouches for, the machine its ELF header
//! names, and what the binary itself answers to `--version`.
//!
//! A signature's trusted comment (the part minisign signs too) reads
//! `k8s4r-agent version=V arch=A`: a valid signature of version 1.0 can
//! then not be replayed as version 2.0, nor an x86_64 build sent to an ARM
//! robot under a signed aarch64 name.
//!
//! Versions are ordered as semantic versions, and a robot never goes back
//! to a version older than the one it runs (a replayed old release, with
//! the flaws it had, is refused) unless the signature itself says so:
//! `k8s4r-agent version=V arch=A downgrade-from=F`, made by
//! `k8s4r sign-agent --downgrade-from F`, allows exactly the step from F
//! down to V. Without a pinned key (`allow_unsigned_upgrades`) there is no
//! one to say it, and nothing to protect: whoever may order an unsigned
//! upgrade may order any binary.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use minisign_verify::{PublicKey, Signature};
use sha2::{Digest, Sha256};

/// What a rollout says the artifact is.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    pub version: &'a str,
    /// The version this robot runs (its confirmed binary's): a version
    /// older than it needs a signed downgrade.
    pub running: &'a str,
    /// Hex, either case.
    pub sha256: &'a str,
    /// The minisign signature file's text.
    pub signature: Option<&'a str>,
}

/// What this robot trusts, from its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Minisign public keys (their base64 line); any one may sign.
    Keys(Vec<String>),
    /// No key pinned, and the configuration allows unsigned upgrades: the
    /// sha256 (which the rollout carries) is the only check of content.
    UnsignedAllowed,
    /// No key pinned: upgrades are refused.
    Nothing,
}

/// Why a binary is not staged. Each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("its sha256 is {found}, the rollout names {expected}")]
    Digest { expected: String, found: String },
    #[error(
        "this robot pins no upgrade key (upgrade_public_keys in agent.toml); \
         set allow_unsigned_upgrades = true to accept unsigned upgrades"
    )]
    NoKey,
    #[error("the rollout carries no signature and this robot pins a key")]
    Unsigned,
    #[error("its signature does not verify against the keys this robot pins ({0})")]
    Signature(String),
    #[error("its signature vouches for `{found}`, not `k8s4r-agent version={version} arch={arch}`")]
    Subject {
        found: String,
        version: String,
        arch: String,
    },
    #[error(
        "version {to} is older than {from}, which this robot runs; only a release signed as a \
         downgrade from {from} (k8s4r sign-agent --downgrade-from {from}) may replace it"
    )]
    Downgrade { from: String, to: String },
    #[error("{0:?} is not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD])")]
    NotSemver(String),
    #[error("it is built for {found}, this robot is {expected}")]
    Architecture { expected: String, found: String },
    #[error("`--version` {0}")]
    Probe(String),
    #[error("cannot read it: {0}")]
    Io(String),
}

/// Checks the file at `path` (not yet executable by anyone but root)
/// against what the rollout says and what this robot trusts, in the order
/// that runs nothing until the content is known: digest, signature, ELF
/// machine. The `--version` probe comes after (see [`probe_version`]).
pub fn check(path: &Path, expected: &Expected<'_>, trust: &Trust) -> Result<(), Refusal> {
    let bytes = std::fs::read(path).map_err(|e| Refusal::Io(e.to_string()))?;
    let found = hex(&Sha256::digest(&bytes));
    if !found.eq_ignore_ascii_case(expected.sha256) {
        return Err(Refusal::Digest {
            expected: expected.sha256.to_ascii_lowercase(),
            found,
        });
    }
    // Before the signature: a binary for another architecture is refused
    // as such, whoever signed it.
    let arch = elf_arch(&bytes).unwrap_or("not a Linux executable this agent knows");
    if arch != std::env::consts::ARCH {
        return Err(Refusal::Architecture {
            expected: std::env::consts::ARCH.to_owned(),
            found: arch.to_owned(),
        });
    }
    let downgrade = is_downgrade(expected.running, expected.version)?;
    match trust {
        Trust::Nothing => return Err(Refusal::NoKey),
        Trust::UnsignedAllowed if expected.signature.is_none() => {}
        Trust::UnsignedAllowed => return Err(Refusal::NoKey),
        Trust::Keys(keys) => verify_signature(&bytes, expected, keys, downgrade)?,
    }
    Ok(())
}

/// Whether going from `running` to `to` goes back, in semantic-version
/// order (build metadata aside, as semver orders).
pub fn is_downgrade(running: &str, to: &str) -> Result<bool, Refusal> {
    let parse = |v: &str| semver::Version::parse(v).map_err(|_| Refusal::NotSemver(v.to_owned()));
    let (running, to) = (parse(running)?, parse(to)?);
    Ok(to.cmp_precedence(&running) == std::cmp::Ordering::Less)
}

fn verify_signature(
    bytes: &[u8],
    expected: &Expected<'_>,
    keys: &[String],
    downgrade: bool,
) -> Result<(), Refusal> {
    let text = expected.signature.ok_or(Refusal::Unsigned)?;
    let signature = Signature::decode(text).map_err(|e| Refusal::Signature(format!("{e:?}")))?;
    let mut last = "no key".to_owned();
    let verified = keys.iter().any(|key| {
        let result = PublicKey::from_base64(key.trim()).and_then(|k| k.verify(bytes, &signature, false));
        if let Err(e) = &result {
            last = format!("{e:?}");
        }
        result.is_ok()
    });
    if !verified {
        return Err(Refusal::Signature(last));
    }
    let subject = Subject::read(signature.trusted_comment());
    if !subject.is_some_and(|s| s.version == expected.version && s.arch == std::env::consts::ARCH) {
        return Err(Refusal::Subject {
            found: signature.trusted_comment().to_owned(),
            version: expected.version.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
        });
    }
    if downgrade && subject.and_then(|s| s.downgrade_from) != Some(expected.running) {
        return Err(Refusal::Downgrade {
            from: expected.running.to_owned(),
            to: expected.version.to_owned(),
        });
    }
    Ok(())
}

/// The trusted comment `k8s4r-agent sign` writes for a binary.
pub fn subject(version: &str, arch: &str) -> String {
    format!("k8s4r-agent version={version} arch={arch}")
}

/// The trusted comment of a signed downgrade from `from` to `version`.
pub fn downgrade_subject(version: &str, arch: &str, from: &str) -> String {
    format!("{} downgrade-from={from}", subject(version, arch))
}

/// What a trusted comment vouches for: this program, a version and an
/// architecture, and the version a downgrade may start from (other
/// `key=value` words may follow, such as a timestamp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Subject<'a> {
    version: &'a str,
    arch: &'a str,
    downgrade_from: Option<&'a str>,
}

impl<'a> Subject<'a> {
    fn read(comment: &'a str) -> Option<Self> {
        let mut words = comment.split_whitespace();
        if words.next() != Some("k8s4r-agent") {
            return None;
        }
        let (mut version, mut arch, mut downgrade_from) = (None, None, None);
        for word in words {
            match word.split_once('=') {
                Some(("version", value)) => version = Some(value),
                Some(("arch", value)) => arch = Some(value),
                Some(("downgrade-from", value)) => downgrade_from = Some(value),
                _ => {}
            }
        }
        Some(Subject {
            version: version?,
            arch: arch?,
            downgrade_from,
        })
    }
}

/// The architecture (as `std::env::consts::ARCH` names it) of a Linux ELF
/// executable, from its header.
pub fn elf_arch(bytes: &[u8]) -> Option<&'static str> {
    if bytes.len() < 20 || bytes[..4] != *b"\x7fELF" {
        return None;
    }
    let little = match bytes[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    let machine = if little {
        u16::from_le_bytes([bytes[18], bytes[19]])
    } else {
        u16::from_be_bytes([bytes[18], bytes[19]])
    };
    let class64 = bytes[4] == 2;
    Some(match (machine, class64) {
        (62, true) => "x86_64",
        (3, false) => "x86",
        (183, true) => "aarch64",
        (40, false) => "arm",
        (243, true) => "riscv64",
        _ => return None,
    })
}

/// Runs the staged binary with `--version` (no configuration, nothing
/// else) and checks it answers `k8s4r-agent VERSION` within `timeout`.
pub fn probe_version(path: &Path, version: &str, timeout: Duration) -> Result<(), Refusal> {
    let mut child = std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| Refusal::Probe(format!("cannot start: {e}")))?;
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Refusal::Probe(format!(
                    "did not answer within {}",
                    k8s4r_api::duration::format_duration(timeout)
                )));
            }
            // Reaped by someone else: the supervisor reaps the zombies of
            // its tasks' lineages, and the agent's own short-lived children
            // may look like one. The exit status is lost; the answer, read
            // below, still decides.
            Err(e) if e.raw_os_error() == Some(nix::libc::ECHILD) => break None,
            Err(e) => return Err(Refusal::Probe(e.to_string())),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.by_ref().take(4096).read_to_string(&mut out);
    }
    let answer = out.trim();
    if let Some(status) = status.filter(|s| !s.success()) {
        return Err(Refusal::Probe(format!("failed ({status})")));
    }
    if answer != format!("k8s4r-agent {version}") {
        return Err(Refusal::Probe(format!(
            "answered `{answer}`, not `k8s4r-agent {version}`"
        )));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Signer {
        pair: minisign::KeyPair,
    }

    impl Signer {
        fn new() -> Self {
            Signer {
                pair: minisign::KeyPair::generate_unencrypted_keypair().unwrap(),
            }
        }
        fn public(&self) -> String {
            self.pair.pk.to_base64()
        }
        fn sign(&self, bytes: &[u8], comment: &str) -> String {
            minisign::sign(Some(&self.pair.pk), &self.pair.sk, bytes, Some(comment), None)
                .unwrap()
                .into_string()
        }
    }

    /// A small ELF of this machine's architecture.
    fn this_binary() -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
        let bytes = std::fs::read("/bin/true").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k8s4r-agent");
        std::fs::write(&path, &bytes).unwrap();
        (dir, path, bytes)
    }

    #[test]
    fn a_signed_binary_of_this_architecture_and_version_passes() {
        let signer = Signer::new();
        let (_dir, path, bytes) = this_binary();
        let digest = hex(&Sha256::digest(&bytes));
        let signature = signer.sign(&bytes, &subject("2.0.0", std::env::consts::ARCH));
        let expected = Expected {
            version: "2.0.0",
            running: "1.0.0",
            sha256: &digest.to_uppercase(),
            signature: Some(&signature),
        };
        let trust = Trust::Keys(vec!["RWQ-not-a-key".into(), signer.public()]);
        assert_eq!(check(&path, &expected, &trust), Ok(()));
    }

    #[test]
    fn wrong_digest_key_subject_or_missing_trust_is_refused_with_the_reason() {
        let signer = Signer::new();
        let other = Signer::new();
        let (_dir, path, bytes) = this_binary();
        let digest = hex(&Sha256::digest(&bytes));
        let arch = std::env::consts::ARCH;
        let good = signer.sign(&bytes, &subject("2.0.0", arch));
        let trust = Trust::Keys(vec![signer.public()]);
        let with = |version, sha256, signature| Expected {
            version,
            running: "1.0.0",
            sha256,
            signature,
        };

        let wrong_sha = "0".repeat(64);
        assert!(matches!(
            check(&path, &with("2.0.0", &wrong_sha, Some(&good)), &trust),
            Err(Refusal::Digest { .. })
        ));
        let by_other = other.sign(&bytes, &subject("2.0.0", arch));
        assert!(matches!(
            check(&path, &with("2.0.0", &digest, Some(&by_other)), &trust),
            Err(Refusal::Signature(_))
        ));
        // A genuine signature of another version is not this version's.
        let replayed = check(&path, &with("3.0.0", &digest, Some(&good)), &trust);
        assert!(matches!(replayed, Err(Refusal::Subject { .. })), "{replayed:?}");
        let other_arch = signer.sign(&bytes, &subject("2.0.0", "riscv64"));
        assert!(matches!(
            check(&path, &with("2.0.0", &digest, Some(&other_arch)), &trust),
            Err(Refusal::Subject { .. })
        ));
        assert_eq!(
            check(&path, &with("2.0.0", &digest, None), &trust),
            Err(Refusal::Unsigned)
        );
        assert_eq!(
            check(&path, &with("2.0.0", &digest, Some(&good)), &Trust::Nothing),
            Err(Refusal::NoKey)
        );
        assert_eq!(
            check(&path, &with("2.0.0", &digest, None), &Trust::UnsignedAllowed),
            Ok(())
        );
        // A tampered byte fails the digest first; a digest made to match
        // the tampered file still fails the signature.
        let mut tampered = bytes.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        std::fs::write(&path, &tampered).unwrap();
        let tampered_digest = hex(&Sha256::digest(&tampered));
        assert!(matches!(
            check(&path, &with("2.0.0", &tampered_digest, Some(&good)), &trust),
            Err(Refusal::Signature(_))
        ));
    }

    #[test]
    fn an_older_release_needs_a_signed_downgrade_from_exactly_the_running_version() {
        let signer = Signer::new();
        let (_dir, path, bytes) = this_binary();
        let digest = hex(&Sha256::digest(&bytes));
        let arch = std::env::consts::ARCH;
        let trust = Trust::Keys(vec![signer.public()]);
        let old_release = signer.sign(&bytes, &subject("1.4.0", arch));
        let order = |signature: &str, running: &'static str| {
            let expected = Expected {
                version: "1.4.0",
                running,
                sha256: &digest,
                signature: Some(signature),
            };
            check(&path, &expected, &trust)
        };
        // The old release's genuine signature, replayed on a robot that
        // moved on: refused, before anything runs.
        let refused = order(&old_release, "2.0.0");
        assert!(matches!(refused, Err(Refusal::Downgrade { .. })), "{refused:?}");
        assert!(refused
            .unwrap_err()
            .to_string()
            .contains("--downgrade-from 2.0.0"));
        // Semantic order, not text order: 1.10.0 is newer than 1.4.0, and a
        // pre-release of 1.4.0 older.
        assert!(matches!(
            order(&old_release, "1.10.0"),
            Err(Refusal::Downgrade { .. })
        ));
        assert_eq!(order(&old_release, "1.4.0-rc.1"), Ok(()));
        assert_eq!(order(&old_release, "1.3.9"), Ok(()));
        // A downgrade signed from 2.0.0 takes a robot on 2.0.0 back, and
        // only from there.
        let back = signer.sign(&bytes, &downgrade_subject("1.4.0", arch, "2.0.0"));
        assert_eq!(order(&back, "2.0.0"), Ok(()));
        assert!(matches!(order(&back, "2.1.0"), Err(Refusal::Downgrade { .. })));
        // The words are signed: a forged comment fails the signature.
        let forged = back.replace("downgrade-from=2.0.0", "downgrade-from=2.1.0");
        assert!(matches!(order(&forged, "2.1.0"), Err(Refusal::Signature(_))));
        // Versions that are not semantic are refused as such.
        assert!(matches!(
            order(&old_release, "latest"),
            Err(Refusal::NotSemver(_))
        ));
        // Without a key there is no one to sign a downgrade, and nothing to
        // guard: an unsigned robot takes any version it is ordered.
        let unsigned = Expected {
            version: "1.4.0",
            running: "2.0.0",
            sha256: &digest,
            signature: None,
        };
        assert_eq!(check(&path, &unsigned, &Trust::UnsignedAllowed), Ok(()));
    }

    #[test]
    fn a_binary_for_another_machine_is_refused_before_it_runs() {
        let (_dir, path, mut bytes) = this_binary();
        let foreign: u16 = if std::env::consts::ARCH == "aarch64" {
            62
        } else {
            183
        };
        bytes[18..20].copy_from_slice(&foreign.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let digest = hex(&Sha256::digest(&bytes));
        let refused = check(
            &path,
            &Expected {
                version: "2.0.0",
                running: "1.0.0",
                sha256: &digest,
                signature: None,
            },
            &Trust::UnsignedAllowed,
        );
        assert!(
            matches!(refused, Err(Refusal::Architecture { .. })),
            "{refused:?}"
        );
        assert_eq!(elf_arch(b"#!/bin/sh\necho k8s4r-agent 2.0.0\n"), None);
    }

    #[test]
    fn the_probe_wants_the_exact_version_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path
        };
        let second = Duration::from_secs(5);
        let good = script("good", "echo k8s4r-agent 2.0.0");
        assert_eq!(probe_version(&good, "2.0.0", second), Ok(()));
        assert!(matches!(
            probe_version(&good, "2.0.1", second),
            Err(Refusal::Probe(m)) if m.contains("answered `k8s4r-agent 2.0.0`")
        ));
        let crashes = script("crashes", "exit 3");
        assert!(
            matches!(probe_version(&crashes, "2.0.0", second), Err(Refusal::Probe(m)) if m.contains("failed"))
        );
        let hangs = script("hangs", "exec sleep 30");
        let started = std::time::Instant::now();
        assert!(matches!(
            probe_version(&hangs, "2.0.0", Duration::from_millis(200)),
            Err(Refusal::Probe(m)) if m.contains("did not answer")
        ));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
