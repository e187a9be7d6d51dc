//! What a task run by the `podman` driver names beyond a command: its
//! image (always by digest), its network and the devices it is given.
//!
//! An image named by tag alone is refused at apply: a tag can point at a
//! different image on each robot (one pulled last month, one pulled
//! today), and a fleet must never run two programs under one name.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most devices one task may name.
pub const MAX_DEVICES: usize = 16;
/// Longest image reference accepted (a registry, a path, a tag and a
/// digest fit well within it).
pub const MAX_IMAGE_LEN: usize = 512;

/// The network a container joins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ContainerNetwork {
    /// The robot's own network (the default): ROS 2's DDS discovery
    /// reaches the other nodes on the robot and its network as a
    /// process's would.
    #[default]
    Host,
    /// A network of the container's own behind NAT (podman's bridge).
    Bridge,
    /// No network but loopback.
    None,
}

impl ContainerNetwork {
    /// Its name for `podman run --network`.
    pub fn podman_name(self) -> &'static str {
        match self {
            ContainerNetwork::Host => "host",
            ContainerNetwork::Bridge => "bridge",
            ContainerNetwork::None => "none",
        }
    }
}

/// Whether `hex` is a sha256 as digests are written: 64 lowercase hex
/// digits.
pub fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An image reference pinned by digest: `[registry/]path[:tag]@sha256:<hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry and path, e.g. `registry.example.com/team/nav`.
    pub name: String,
    /// The tag written beside the digest, if any: informative only, the
    /// digest decides.
    pub tag: Option<String>,
    /// `sha256:` and 64 lowercase hex digits.
    pub digest: String,
}

impl ImageRef {
    /// Parses and checks a reference; the error says what is wrong in a
    /// sentence that can follow the field's name.
    pub fn parse(text: &str) -> Result<ImageRef, String> {
        if text.len() > MAX_IMAGE_LEN {
            return Err(format!("at most {MAX_IMAGE_LEN} bytes"));
        }
        let Some((named, digest)) = text.split_once('@') else {
            return Err(format!(
                "must name the image by digest (name@sha256:<64 hex digits>), got {text:?}: a tag can \
                 name a different image on each robot"
            ));
        };
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("the digest must be sha256:<64 hex digits>, got {digest:?}"))?;
        if !is_sha256_hex(hex) {
            return Err(format!(
                "the digest must be sha256:<64 lowercase hex digits>, got {digest:?}"
            ));
        }
        // A tag is after the last ':' that follows the last '/' (a ':'
        // before it is a registry's port).
        let last_slash = named.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match named[last_slash..].rfind(':') {
            Some(i) => (&named[..last_slash + i], Some(&named[last_slash + i + 1..])),
            None => (named, None),
        };
        check_name(name)?;
        if let Some(tag) = tag {
            let ok = !tag.is_empty()
                && tag.len() <= 128
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                && !tag.starts_with(['.', '-']);
            if !ok {
                return Err(format!("invalid tag {tag:?}"));
            }
        }
        Ok(ImageRef {
            name: name.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.to_owned(),
        })
    }

    /// The reference podman is given: the name and the digest (a tag
    /// beside a digest only adds a way to disagree).
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.name, self.digest)
    }
}

/// A repository name: lowercase path components of letters, digits and
/// `._-`, the first of which may be a registry host (with a port).
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the image has no name before its digest".into());
    }
    let mut parts = name.split('/').peekable();
    let first = parts.peek().copied().unwrap_or_default();
    let host = name.contains('/')
        && (first.contains(['.', ':'])
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase()));
    for (i, part) in name.split('/').enumerate() {
        let ok = if i == 0 && host {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
        } else {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
                && part.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        if !ok {
            return Err(format!(
                "invalid image name {name:?}: lowercase letters, digits and ._- in each part, parts \
                 separated by '/', a registry host first"
            ));
        }
    }
    Ok(())
}

/// A device a container is given: a path under `/dev` or a CDI name
/// (`vendor.com/class=name`, e.g. `nvidia.com/gpu=all`). The robot's
/// configuration must allow it by the same text.
pub fn check_device(device: &str) -> Result<(), String> {
    if let Some(rest) = device.strip_prefix("/dev/") {
        let ok = !rest.is_empty()
            && rest
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..")
            && !device.contains([':', '\0'])
            && !device.chars().any(char::is_control);
        return if ok {
            Ok(())
        } else {
            Err(format!("invalid device path {device:?}"))
        };
    }
    let cdi = device.split_once('=').is_some_and(|(kind, name)| {
        kind.split_once('/').is_some_and(|(vendor, class)| {
            vendor.contains('.')
                && !class.is_empty()
                && (vendor.bytes().chain(class.bytes()))
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        }) && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
    });
    if cdi {
        Ok(())
    } else {
        Err(format!(
            "must be a path under /dev/ or a CDI name such as nvidia.com/gpu=all, got {device:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "b00361b0279911e97f8cf427e80b5cfc100ffc1b734010fb3423978d82249312";

    #[test]
    fn a_reference_by_digest_parses_with_or_without_a_tag_and_a_registry_port() {
        let r = ImageRef::parse(&format!("localhost:5000/team/nav@sha256:{HEX}")).unwrap();
        assert_eq!(r.name, "localhost:5000/team/nav");
        assert_eq!(r.tag, None);
        let r = ImageRef::parse(&format!("ros:humble@sha256:{HEX}")).unwrap();
        assert_eq!((r.name.as_str(), r.tag.as_deref()), ("ros", Some("humble")));
        assert_eq!(r.pinned(), format!("ros@sha256:{HEX}"));
    }

    #[test]
    fn a_tag_alone_or_a_bad_digest_is_refused_saying_why() {
        let e = ImageRef::parse("ros:humble").unwrap_err();
        assert!(e.contains("by digest"), "{e}");
        assert!(ImageRef::parse("ros@sha256:abc").unwrap_err().contains("64"));
        assert!(ImageRef::parse(&format!("ros@md5:{HEX}")).is_err());
        assert!(ImageRef::parse(&format!("ros@sha256:{}", HEX.to_uppercase())).is_err());
        assert!(ImageRef::parse(&format!("Ros/Nav@sha256:{HEX}")).is_err());
        assert!(ImageRef::parse(&format!("@sha256:{HEX}")).is_err());
        assert!(ImageRef::parse(&format!("a//b@sha256:{HEX}")).is_err());
    }

    #[test]
    fn devices_are_dev_paths_or_cdi_names() {
        for ok in [
            "/dev/video0",
            "/dev/serial/by-id/usb-x",
            "nvidia.com/gpu=all",
            "nvidia.com/gpu=0",
        ] {
            assert_eq!(check_device(ok), Ok(()), "{ok}");
        }
        for bad in [
            "/dev/",
            "/dev/../etc/shadow",
            "/etc/shadow",
            "gpu",
            "nvidia.com/gpu=",
            "/dev/a:/dev/b",
        ] {
            assert!(check_device(bad).is_err(), "{bad}");
        }
    }
}
