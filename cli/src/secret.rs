//! Random secrets: `up`'s tokens, the dashboard's login and CSRF tokens.

use crate::UpError;

/// 24 random bytes, in hex: a token no one can guess.
pub fn random_secret() -> Result<String, UpError> {
    let mut bytes = [0u8; 24];
    let mut urandom = std::fs::File::open("/dev/urandom").map_err(|source| UpError::Io {
        what: "open /dev/urandom".to_owned(),
        source,
    })?;
    std::io::Read::read_exact(&mut urandom, &mut bytes).map_err(|source| UpError::Io {
        what: "read /dev/urandom".to_owned(),
        source,
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
