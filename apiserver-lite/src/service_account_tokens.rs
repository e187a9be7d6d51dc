//! Bound ServiceAccount tokens, as TokenRequest (`kubectl create token`)
//! hands them out: a JWT naming the ServiceAccount (and its uid), the
//! audiences and an expiry, signed with HMAC-SHA256 under a key only this
//! server holds. The key is kept in the data directory (0600), so tokens
//! outlive a restart; an in-memory server makes a new one every start.
//!
//! A token is accepted while it has not expired, names this server's
//! audience, and its ServiceAccount still exists with the uid it was issued
//! for: deleting the ServiceAccount (and making another of the same name)
//! revokes every token issued for the old one.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::hmac;
use serde_json::{json, Value};

use crate::store::State;
use crate::user::User;

/// The issuer and the audience the server accepts, the one a real
/// cluster's API server has by default.
pub const AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// A token lives an hour unless the request says otherwise.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 60 * 60;
/// The shortest life a request may ask for, as on a real server.
pub const MIN_EXPIRATION_SECONDS: i64 = 10 * 60;
/// The longest life a token gets; longer requests are shortened to it (a
/// real server's `--service-account-max-token-expiration`).
pub const MAX_EXPIRATION_SECONDS: i64 = 48 * 60 * 60;
/// Where the signing key is kept in the data directory.
pub const KEY_FILE: &str = "service-account-signing.key";
const KEY_BYTES: usize = 32;
const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// What a token is issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub namespace: String,
    pub name: String,
    /// The ServiceAccount's uid when the token was issued.
    pub uid: String,
    pub audiences: Vec<String>,
    /// Seconds since the epoch.
    pub issued_at: i64,
    pub expires_at: i64,
}

/// Signs and checks tokens.
pub struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    /// The key kept in `dir` (made on first use), or a new one for a server
    /// without a data directory.
    pub fn load_or_generate(dir: Option<&Path>) -> std::io::Result<Signer> {
        let Some(dir) = dir else {
            return Ok(Signer::from_bytes(&random_key()?));
        };
        let path = dir.join(KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() == KEY_BYTES => {
                crate::private_files::narrow_existing(&path)?;
                Ok(Signer::from_bytes(&bytes))
            }
            Ok(bytes) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} holds {} bytes, not a {KEY_BYTES}-byte key; remove it to make a new one (tokens issued so far stop working)",
                    path.display(),
                    bytes.len()
                ),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = random_key()?;
                crate::private_files::write(&path, &key)?;
                Ok(Signer::from_bytes(&key))
            }
            Err(e) => Err(e),
        }
    }

    pub fn from_bytes(key: &[u8]) -> Signer {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    /// The token for `grant`.
    pub fn issue(&self, grant: &Grant) -> String {
        let claims = json!({
            "iss": AUDIENCE,
            "sub": format!("system:serviceaccount:{}:{}", grant.namespace, grant.name),
            "aud": grant.audiences,
            "iat": grant.issued_at,
            "nbf": grant.issued_at,
            "exp": grant.expires_at,
            "jti": uuid::Uuid::new_v4().to_string(),
            "kubernetes.io": {
                "namespace": grant.namespace,
                "serviceaccount": {"name": grant.name, "uid": grant.uid},
            },
        });
        let signed = format!("{}.{}", B64.encode(HEADER), B64.encode(claims.to_string()));
        let tag = hmac::sign(&self.key, signed.as_bytes());
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    }

    /// What a well-signed token says, whatever its age; `None` for anything
    /// this server did not sign.
    pub fn read(&self, token: &str) -> Option<Grant> {
        let (signed, tag) = token.rsplit_once('.')?;
        let (header, claims) = signed.split_once('.')?;
        hmac::verify(&self.key, signed.as_bytes(), &B64.decode(tag).ok()?).ok()?;
        if B64.decode(header).ok()? != HEADER.as_bytes() {
            return None;
        }
        let claims: Value = serde_json::from_slice(&B64.decode(claims).ok()?).ok()?;
        let account = &claims["kubernetes.io"];
        Some(Grant {
            namespace: account["namespace"].as_str()?.to_owned(),
            name: account["serviceaccount"]["name"].as_str()?.to_owned(),
            uid: account["serviceaccount"]["uid"].as_str()?.to_owned(),
            audiences: claims["aud"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            issued_at: claims["iat"].as_i64()?,
            expires_at: claims["exp"].as_i64()?,
        })
    }

    /// The user a token stands for at `now` (seconds since the epoch), if
    /// it is still good: see the module's comment.
    pub fn authenticate(&self, state: &State, token: &str, now: i64) -> Option<User> {
        let grant = self.read(token)?;
        if !grant.valid_at(now) || !grant.audiences.iter().any(|a| a == AUDIENCE) {
            return None;
        }
        let account = state.get("serviceaccounts", &grant.namespace, &grant.name)?;
        let meta = &account["metadata"];
        if meta["uid"].as_str() != Some(grant.uid.as_str()) || !meta["deletionTimestamp"].is_null() {
            return None;
        }
        Some(User::service_account(&grant.namespace, &grant.name).with_uid(grant.uid))
    }
}

impl Grant {
    fn valid_at(&self, now: i64) -> bool {
        self.issued_at <= now + CLOCK_SKEW_SECONDS && now < self.expires_at
    }
}

/// How far ahead of our clock a token's issue time may be (none is, as we
/// issue them, but a clock stepped back must not void every token).
const CLOCK_SKEW_SECONDS: i64 = 60;

/// How long a token asked for `requested` seconds lives, or why the
/// request is refused.
pub fn lifetime(requested: Option<i64>) -> Result<i64, String> {
    match requested {
        None => Ok(DEFAULT_EXPIRATION_SECONDS),
        Some(s) if s < MIN_EXPIRATION_SECONDS => Err(format!(
            "may not specify a duration less than {} minutes",
            MIN_EXPIRATION_SECONDS / 60
        )),
        Some(s) => Ok(s.min(MAX_EXPIRATION_SECONDS)),
    }
}

fn random_key() -> std::io::Result<[u8; KEY_BYTES]> {
    use ring::rand::SecureRandom;
    let mut key = [0u8; KEY_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| std::io::Error::other("no randomness for the service-account signing key"))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            namespace: "ns".into(),
            name: "viewer".into(),
            uid: "u1".into(),
            audiences: vec![AUDIENCE.into()],
            issued_at: 1_000,
            expires_at: 4_600,
        }
    }

    #[test]
    fn a_token_reads_back_only_under_its_key() {
        let signer = Signer::from_bytes(b"0123456789abcdef0123456789abcdef");
        let token = signer.issue(&grant());
        assert_eq!(signer.read(&token), Some(grant()));
        let other = Signer::from_bytes(b"another key, another server.....");
        assert_eq!(other.read(&token), None);
        // A changed claim breaks the signature.
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let mut forged = grant();
        forged.name = "admin".into();
        let forged_claims = Signer::from_bytes(b"x").issue(&forged);
        parts[1] = forged_claims.split('.').nth(1).unwrap().to_owned();
        assert_eq!(signer.read(&parts.join(".")), None);
        assert_eq!(signer.read("not.a-token"), None);
    }

    #[test]
    fn tokens_are_good_until_they_expire() {
        let g = grant();
        assert!(g.valid_at(1_000));
        assert!(g.valid_at(4_599));
        assert!(!g.valid_at(4_600));
        assert!(!g.valid_at(800));
    }

    #[test]
    fn lifetimes_default_to_an_hour_and_are_bounded() {
        assert_eq!(lifetime(None), Ok(3600));
        assert_eq!(lifetime(Some(600)), Ok(600));
        assert!(lifetime(Some(599)).unwrap_err().contains("10 minutes"));
        assert_eq!(lifetime(Some(10 * 365 * 86_400)), Ok(MAX_EXPIRATION_SECONDS));
    }

    #[test]
    fn the_key_is_kept_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = Signer::load_or_generate(Some(dir.path())).unwrap();
        let token = first.issue(&grant());
        let again = Signer::load_or_generate(Some(dir.path())).unwrap();
        assert_eq!(again.read(&token), Some(grant()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
