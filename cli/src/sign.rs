//! `k8s4r sign-agent`: the minisign key pair that signs agent upgrades,
//! and the signature of one agent binary, vouching for its version and
//! architecture (the agent refuses a signature that names others).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use k8s4r_agent::upgrade::verify::{downgrade_subject, elf_arch, is_downgrade, subject};
use sha2::{Digest, Sha256};

/// `k8s4r sign-agent`.
#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The agent binary to sign (writes BINARY.minisig beside it).
    #[arg(required_unless_present = "generate")]
    pub binary: Option<PathBuf>,
    /// The secret key file (made with --generate).
    #[arg(long, value_name = "FILE")]
    pub secret_key: PathBuf,
    /// Make a new key pair instead: the secret key in --secret-key (only
    /// its owner may read it), the public key beside it (.pub) and on
    /// standard output, for the robots' upgrade_public_keys.
    #[arg(long, conflicts_with = "binary")]
    pub generate: bool,
    /// A file holding the password that encrypts the secret key (made with
    /// it, or needed to sign with it). Without it the key is stored
    /// unencrypted.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// The binary's version, as its `--version` prints it. Default: asked
    /// from the binary, when it runs on this machine.
    #[arg(long, value_name = "VERSION")]
    pub agent_version: Option<String>,
    /// Sign a downgrade: robots that run exactly VERSION (newer than this
    /// binary) may go back to it. Without it, a robot refuses any version
    /// older than the one it runs, so that an old signed release cannot be
    /// ordered again.
    #[arg(long, value_name = "VERSION")]
    pub downgrade_from: Option<String>,
}

pub fn run(args: &SignArgs) -> anyhow::Result<()> {
    let password = match &args.password_file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        None => None,
    };
    match (&args.binary, args.generate) {
        (_, true) => generate(&args.secret_key, password),
        (Some(binary), false) => sign(
            binary,
            &args.secret_key,
            password,
            args.agent_version.as_deref(),
            args.downgrade_from.as_deref(),
        ),
        (None, false) => bail!("name the binary to sign, or --generate a key pair"),
    }
}

fn generate(secret_key: &Path, password: Option<String>) -> anyhow::Result<()> {
    let encrypted = password.is_some();
    let pair = if encrypted {
        minisign::KeyPair::generate_encrypted_keypair(password)
    } else {
        minisign::KeyPair::generate_unencrypted_keypair()
    }
    .context("cannot make a key pair")?;
    let secret = pair.sk.to_box(Some("k8s4r agent signing key"))?.into_string();
    write_new(secret_key, secret.as_bytes(), 0o600)?;
    let public_path = public_path(secret_key);
    write_new(&public_path, pair.pk.to_box()?.into_string().as_bytes(), 0o644)?;
    eprintln!(
        "k8s4r: wrote the secret key {}{} and the public key {}; pin the public key on every robot \
         (agent.toml):",
        secret_key.display(),
        if encrypted {
            ""
        } else {
            " (unencrypted: keep it offline)"
        },
        public_path.display()
    );
    println!("upgrade_public_keys = [\"{}\"]", pair.pk.to_base64());
    Ok(())
}

fn sign(
    binary: &Path,
    secret_key: &Path,
    password: Option<String>,
    version: Option<&str>,
    downgrade_from: Option<&str>,
) -> anyhow::Result<()> {
    let bytes = std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let Some(arch) = elf_arch(&bytes) else {
        bail!(
            "{} is not a Linux executable of an architecture robots run",
            binary.display()
        );
    };
    let version = match version {
        Some(v) => v.to_owned(),
        None => ask_version(binary, arch)?,
    };
    let comment = match downgrade_from {
        None => subject(&version, arch),
        Some(from) => {
            if !is_downgrade(from, &version).map_err(|e| anyhow::anyhow!("{e}"))? {
                bail!("--downgrade-from {from}: {version} is not older than {from}");
            }
            downgrade_subject(&version, arch, from)
        }
    };
    let key = if password.is_some() {
        minisign::SecretKey::from_file(secret_key, password)
    } else {
        minisign::SecretKeyBox::from_string(
            &std::fs::read_to_string(secret_key)
                .with_context(|| format!("cannot read {}", secret_key.display()))?,
        )
        .and_then(minisign::SecretKeyBox::into_unencrypted_secret_key)
    }
    .with_context(|| format!("cannot use the secret key {}", secret_key.display()))?;
    let signature = minisign::sign(None, &key, bytes.as_slice(), Some(&comment), None)
        .context("cannot sign")?
        .into_string();
    let mut signature_path = binary.as_os_str().to_owned();
    signature_path.push(".minisig");
    let signature_path = PathBuf::from(signature_path);
    std::fs::write(&signature_path, &signature)
        .with_context(|| format!("cannot write {}", signature_path.display()))?;
    let sha256: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    eprintln!(
        "k8s4r: signed {} (k8s4r-agent {version}, {arch}) into {}; its AgentRollout artifact:",
        binary.display(),
        signature_path.display()
    );
    print!(
        "- arch: {arch}\n  url: https://…/{}\n  sha256: {sha256}\n  signature: |\n{}",
        binary
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        signature
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    Ok(())
}

/// The version a binary of this machine's architecture prints.
fn ask_version(binary: &Path, arch: &str) -> anyhow::Result<String> {
    if arch != std::env::consts::ARCH {
        bail!(
            "{} is built for {arch}: give its version with --agent-version",
            binary.display()
        );
    }
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {} --version", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().strip_prefix("k8s4r-agent ") {
        Some(version) if out.status.success() && !version.is_empty() => Ok(version.to_owned()),
        _ => bail!(
            "{} --version answered `{}`: is it the k8s4r agent? (--agent-version overrides)",
            binary.display(),
            text.trim()
        ),
    }
}

fn public_path(secret_key: &Path) -> PathBuf {
    let mut path = secret_key.as_os_str().to_owned();
    path.push(".pub");
    PathBuf::from(path)
}

/// Writes a file that must not exist yet (a key is never overwritten).
fn write_new(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_agent::upgrade::verify::{check, Expected, Trust};

    #[test]
    fn a_generated_key_signs_what_the_agent_then_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("signing.key");
        generate(&secret, None).unwrap();
        assert!(generate(&secret, None).is_err(), "a key is never overwritten");
        let public = minisign::PublicKey::from_file(public_path(&secret)).unwrap();
        let binary = dir.path().join("k8s4r-agent");
        std::fs::copy("/bin/true", &binary).unwrap();
        sign(&binary, &secret, None, Some("0.3.0"), None).unwrap();
        let signature = std::fs::read_to_string(dir.path().join("k8s4r-agent.minisig")).unwrap();
        let sha256: String = Sha256::digest(std::fs::read(&binary).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let expected = Expected {
            version: "0.3.0",
            running: "0.2.0",
            sha256: &sha256,
            signature: Some(&signature),
        };
        let trust = Trust::Keys(vec![public.to_base64()]);
        assert_eq!(check(&binary, &expected, &trust), Ok(()));
        let other_version = Expected {
            version: "0.3.1",
            ..expected
        };
        assert!(check(&binary, &other_version, &trust).is_err());
    }

    #[test]
    fn a_signed_downgrade_takes_back_exactly_the_version_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("signing.key");
        generate(&secret, None).unwrap();
        let public = minisign::PublicKey::from_file(public_path(&secret)).unwrap();
        let binary = dir.path().join("k8s4r-agent");
        std::fs::copy("/bin/true", &binary).unwrap();
        let refused = sign(&binary, &secret, None, Some("0.3.0"), Some("0.2.0")).unwrap_err();
        assert!(refused.to_string().contains("not older than 0.2.0"), "{refused}");
        sign(&binary, &secret, None, Some("0.3.0"), Some("0.4.0")).unwrap();
        let signature = std::fs::read_to_string(dir.path().join("k8s4r-agent.minisig")).unwrap();
        let sha256: String = Sha256::digest(std::fs::read(&binary).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let trust = Trust::Keys(vec![public.to_base64()]);
        let from = |running| Expected {
            version: "0.3.0",
            running,
            sha256: &sha256,
            signature: Some(&signature),
        };
        assert_eq!(check(&binary, &from("0.4.0"), &trust), Ok(()));
        assert!(check(&binary, &from("0.5.0"), &trust).is_err());
    }

    #[test]
    fn an_encrypted_key_needs_its_password() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("signing.key");
        generate(&secret, Some("horse battery".into())).unwrap();
        let binary = dir.path().join("k8s4r-agent");
        std::fs::copy("/bin/true", &binary).unwrap();
        assert!(sign(&binary, &secret, None, Some("0.3.0"), None).is_err());
        sign(
            &binary,
            &secret,
            Some("horse battery".into()),
            Some("0.3.0"),
            None,
        )
        .unwrap();
    }

    #[test]
    fn the_version_of_a_foreign_binary_must_be_given() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("k8s4r-agent");
        let mut bytes = std::fs::read("/bin/true").unwrap();
        let foreign: u16 = if std::env::consts::ARCH == "aarch64" {
            62
        } else {
            183
        };
        bytes[18..20].copy_from_slice(&foreign.to_le_bytes());
        std::fs::write(&binary, bytes).unwrap();
        let err = ask_version(&binary, elf_arch(&std::fs::read(&binary).unwrap()).unwrap()).unwrap_err();
        assert!(err.to_string().contains("--agent-version"), "{err}");
    }
}
