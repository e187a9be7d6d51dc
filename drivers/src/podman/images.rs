//! The images the agent brought onto the robot, and which of them go.
//!
//! The agent removes only images it brought: pulled for a task, or loaded
//! by `k8s4r image push`. Each has a mark, `<run_dir>/images/<hex>` (the
//! hex of its digest), holding the reference it came by; the mark's time
//! is when a task last prepared with it, or when it was loaded. An image
//! put in the store another way (by hand, by another tool) has no mark
//! and is neither counted nor touched.
//!
//! [`plan`] decides, without I/O: the images held tasks name stay; of the
//! others the `keep` used last stay, and then the oldest go while the
//! images together are over the budget. An image used within [`GRACE`]
//! stays whatever the count or the budget: a task is starting from it,
//! or it was pushed for one that is on its way. [`PodmanDriver::remove_images`]
//! removes by image id, without force, so podman itself refuses while a
//! container (of any task, or of anybody) uses the image or another name
//! holds it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s4r_api::container::{is_sha256_hex, ImageRef};

use super::{last_line, run_with_timeout, PodmanConfig, PodmanDriver};

/// How long after its last use an image is safe from removal: longer
/// than a task takes from its image check to its container.
pub const GRACE: Duration = Duration::from_secs(600);

/// How long one podman call of the collection may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// An image the agent brought, as it stands in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// `sha256:<hex>`: the manifest digest tasks name it by.
    pub digest: String,
    /// The reference it came by (`name@sha256:...`).
    pub pinned: String,
    /// When a task last prepared with it, or when it was loaded.
    pub used: SystemTime,
    /// podman's image id.
    pub id: String,
    /// Its size in the store, as podman counts it.
    pub size: u64,
}

/// What may stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Unused images kept, the most recently used first.
    pub keep: usize,
    /// Bytes all the agent's images may take together, if bounded.
    pub budget: Option<u64>,
}

/// Why an image goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// No held task names it and `keep` others were used after it.
    BeyondNewest { keep: usize },
    /// The images took `total` bytes, over the budget.
    OverBudget { total: u64, budget: u64 },
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::BeyondNewest { keep } => write!(f, "unused, and {keep} unused images were used after it"),
            Why::OverBudget { total, budget } => {
                write!(
                    f,
                    "unused, and the images take {total} bytes, over the budget of {budget}"
                )
            }
        }
    }
}

/// The images to remove (indices into `images`, with why), oldest last
/// use first within each rule. `referenced`: the digests held tasks name.
pub fn plan(
    images: &[Held],
    referenced: &HashSet<String>,
    policy: Policy,
    now: SystemTime,
) -> Vec<(usize, Why)> {
    let recent = |h: &Held| match now.duration_since(h.used) {
        Ok(age) => age < GRACE,
        // Used after now: a clock stepped back.
        Err(_) => true,
    };
    // Unused, the most recently used first (the digest breaks ties, so
    // the same inputs give the same plan).
    let mut unused: Vec<usize> = (0..images.len())
        .filter(|&i| !referenced.contains(&images[i].digest))
        .collect();
    unused.sort_by(|&a, &b| {
        images[b]
            .used
            .cmp(&images[a].used)
            .then_with(|| images[a].digest.cmp(&images[b].digest))
    });
    let mut doomed: Vec<(usize, Why)> = unused
        .iter()
        .skip(policy.keep)
        .rev()
        .filter(|&&i| !recent(&images[i]))
        .map(|&i| (i, Why::BeyondNewest { keep: policy.keep }))
        .collect();
    let Some(budget) = policy.budget else {
        return doomed;
    };
    // What stays takes its size once per image id (two digests may name
    // one image).
    let staying_size = |doomed: &[(usize, Why)]| {
        let mut ids = HashSet::new();
        (0..images.len())
            .filter(|i| !doomed.iter().any(|(d, _)| d == i))
            .filter(|&i| ids.insert(images[i].id.as_str()))
            .map(|i| images[i].size)
            .sum::<u64>()
    };
    for &i in unused.iter().rev() {
        let total = staying_size(&doomed);
        if total <= budget {
            break;
        }
        if recent(&images[i]) || doomed.iter().any(|(d, _)| *d == i) {
            continue;
        }
        doomed.push((i, Why::OverBudget { total, budget }));
    }
    doomed
}

/// What a collection did.
#[derive(Debug, Default)]
pub struct Collected {
    /// Removed, with why.
    pub removed: Vec<(Held, Why)>,
    /// Meant to go but kept: podman refused (in use, another name) or a
    /// task used it meanwhile.
    pub kept: Vec<(Held, String)>,
}

impl PodmanConfig {
    /// Where the marks of the images the agent brought are (a pushed
    /// image's is written by the push).
    pub fn image_marks_dir(&self) -> PathBuf {
        self.run_dir.join("images")
    }
}

impl PodmanDriver {
    fn marks_dir(&self) -> PathBuf {
        self.config.image_marks_dir()
    }

    /// The lock between noting an image's use and removing it: held
    /// across a task's look for its image, and across each removal. None
    /// when it cannot be taken (the marks' directory is not writable):
    /// then nothing is removed either.
    pub(super) fn lock_marks(&self) -> Option<nix::fcntl::Flock<std::fs::File>> {
        let dir = self.marks_dir();
        std::fs::create_dir_all(&dir).ok()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(".lock"))
            .ok()?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).ok()
    }

    /// Notes that a task prepares with `image` now. `brought`: the agent
    /// pulled it, so it is the agent's to remove; an image that was there
    /// already is noted only if the agent brought it before.
    pub(super) fn mark_used(&self, image: &ImageRef, brought: bool) {
        let Some(hex) = image.digest.strip_prefix("sha256:") else {
            return;
        };
        let mark = self.marks_dir().join(hex);
        if !brought && !mark.exists() {
            return;
        }
        let written =
            std::fs::create_dir_all(self.marks_dir()).and_then(|()| std::fs::write(&mark, image.pinned()));
        if let Err(e) = written {
            tracing::warn!(mark = %mark.display(), error = %e, "cannot note an image's use; it may be removed while unused for long");
        }
    }

    /// The images the agent brought that are still in the store. A mark
    /// whose image is gone (removed by hand) is forgotten.
    pub fn images_held(&self) -> Vec<Held> {
        let Ok(entries) = std::fs::read_dir(self.marks_dir()) else {
            return Vec::new();
        };
        let mut held = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(digest) = digest_of_mark(&path) else {
                continue;
            };
            let Ok(pinned) = std::fs::read_to_string(&path) else {
                continue;
            };
            let pinned = pinned.trim().to_owned();
            let same = ImageRef::parse(&pinned).is_ok_and(|r| r.digest == digest);
            if !same {
                tracing::warn!(mark = %path.display(), "an image mark that names another image; forgotten");
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Ok(used) = entry.metadata().and_then(|m| m.modified()) else {
                continue;
            };
            match self.inspect(&pinned) {
                Inspected::Found { id, size } => held.push(Held {
                    digest,
                    pinned,
                    used,
                    id,
                    size,
                }),
                Inspected::Gone => {
                    let _ = std::fs::remove_file(&path);
                }
                Inspected::Unknown(why) => {
                    tracing::warn!(image = %pinned, error = %why, "cannot inspect an image; not counted this time")
                }
            }
        }
        held
    }

    /// Where podman keeps its images (its graph root).
    pub fn store_root(&self) -> Option<PathBuf> {
        let mut info = self.command();
        info.args(["info", "--format", "{{.Store.GraphRoot}}"]);
        let out = run_with_timeout(info, CALL_TIMEOUT).ok()??;
        let root = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (out.status.success() && !root.is_empty()).then(|| PathBuf::from(root))
    }

    /// Removes the images `plan` chose, each unless a task used it since
    /// `now` went by [`GRACE`] (its mark is looked at again just before).
    pub fn remove_images(&self, doomed: Vec<(Held, Why)>, now: SystemTime) -> Collected {
        let mut collected = Collected::default();
        for (held, why) in doomed {
            let Some(_lock) = self.lock_marks() else {
                collected
                    .kept
                    .push((held, "cannot take the lock of the image marks".into()));
                continue;
            };
            let mark = self.marks_dir().join(held.digest.trim_start_matches("sha256:"));
            let used = std::fs::metadata(&mark).and_then(|m| m.modified()).unwrap_or(now);
            if now.duration_since(used).unwrap_or_default() < GRACE {
                collected.kept.push((held, "a task used it meanwhile".into()));
                continue;
            }
            let mut rmi = self.command();
            rmi.args(["rmi", &held.id]);
            match run_with_timeout(rmi, CALL_TIMEOUT) {
                Ok(Some(out)) if out.status.success() => {
                    let _ = std::fs::remove_file(&mark);
                    collected.removed.push((held, why));
                }
                Ok(Some(out)) => {
                    let why = last_line(&out.stderr);
                    collected.kept.push((held, why));
                }
                Ok(None) => collected.kept.push((held, "podman rmi took too long".into())),
                Err(e) => collected.kept.push((held, format!("cannot run podman: {e}"))),
            }
        }
        collected
    }

    fn inspect(&self, pinned: &str) -> Inspected {
        let mut inspect = self.command();
        inspect.args(["image", "inspect", "--format", "{{.Id}} {{.Size}}", pinned]);
        match run_with_timeout(inspect, CALL_TIMEOUT) {
            Ok(Some(out)) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout);
                let mut words = text.split_whitespace();
                match (words.next(), words.next().and_then(|s| s.parse().ok())) {
                    (Some(id), Some(size)) if id.bytes().all(|b| b.is_ascii_hexdigit()) => Inspected::Found {
                        id: id.to_owned(),
                        size,
                    },
                    _ => Inspected::Unknown(format!("podman said {:?}", text.trim())),
                }
            }
            Ok(Some(out)) => {
                let why = last_line(&out.stderr);
                if why.contains("image not known") || why.contains("no such image") {
                    Inspected::Gone
                } else {
                    Inspected::Unknown(why)
                }
            }
            Ok(None) => Inspected::Unknown("podman image inspect took too long".into()),
            Err(e) => Inspected::Unknown(format!("cannot run podman: {e}")),
        }
    }
}

enum Inspected {
    Found { id: String, size: u64 },
    Gone,
    Unknown(String),
}

/// `sha256:<hex>` for a mark named by 64 lowercase hex digits.
fn digest_of_mark(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    is_sha256_hex(name).then(|| format!("sha256:{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn image(n: u8, minutes_ago: u64, size: u64) -> Held {
        Held {
            digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
            pinned: String::new(),
            used: SystemTime::UNIX_EPOCH + Duration::from_secs(100_000 - minutes_ago * 60),
            id: format!("id{n}"),
            size,
        }
    }

    /// Keep `keep` unused images, within `budget` bytes.
    fn keeping(keep: usize, budget: Option<u64>) -> Policy {
        Policy { keep, budget }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(100_000)
    }

    fn gone(images: &[Held], referenced: &[u8], policy: Policy) -> Vec<u8> {
        let referenced = referenced.iter().map(|&n| image(n, 0, 0).digest).collect();
        plan(images, &referenced, policy, now())
            .into_iter()
            .map(|(i, _)| images[i].id[2..].parse().unwrap())
            .collect()
    }

    #[test]
    fn the_newest_unused_stay_and_the_older_go_oldest_first() {
        let images = [
            image(1, 60, MIB),
            image(2, 20, MIB),
            image(3, 300, MIB),
            image(4, 40, MIB),
        ];
        let policy = keeping(2, None);
        assert_eq!(gone(&images, &[], policy), [3, 1]);
        assert_eq!(gone(&images, &[], keeping(0, None)), [3, 1, 4, 2]);
        assert!(gone(&images, &[], keeping(4, None)).is_empty());
    }

    #[test]
    fn an_image_a_held_task_names_stays_and_does_not_count_among_the_kept() {
        let images = [image(1, 60, MIB), image(2, 20, MIB), image(3, 300, MIB)];
        // 3 is named by a task: of the unused, 2 is the newest and stays.
        assert_eq!(gone(&images, &[3], keeping(1, None)), [1]);
        assert!(gone(&images, &[1, 2, 3], keeping(0, Some(0))).is_empty());
    }

    #[test]
    fn an_image_used_within_the_grace_stays_whatever_the_count_or_the_budget() {
        let images = [image(1, 5, MIB), image(2, 60, MIB)];
        assert_eq!(gone(&images, &[], keeping(0, Some(0))), [2]);
        // Used in the future (a clock stepped back): recent as well.
        let mut ahead = image(3, 0, MIB);
        ahead.used = now() + Duration::from_secs(3600);
        assert!(gone(&[ahead], &[], keeping(0, None)).is_empty());
    }

    #[test]
    fn over_the_budget_the_oldest_kept_go_until_the_rest_fits() {
        let images = [
            image(1, 100, 400 * MIB),
            image(2, 90, 300 * MIB),
            image(3, 80, 200 * MIB),
            image(4, 70, 100 * MIB),
        ];
        // Keep all four by count; 1000 MiB against 600: 1 goes (600 left).
        let policy = keeping(10, Some(600 * MIB));
        assert_eq!(gone(&images, &[], policy), [1]);
        // A referenced image counts but stays: 1 is named, so 2 and 3 go.
        let named = gone(&images, &[1], keeping(10, Some(500 * MIB)));
        assert_eq!(named, [2, 3]);
        let plan = plan(&images, &HashSet::new(), policy, now());
        assert_eq!(
            plan[0].1,
            Why::OverBudget {
                total: 1000 * MIB,
                budget: 600 * MIB
            }
        );
    }

    #[test]
    fn one_image_under_two_digests_counts_once_against_the_budget() {
        let mut twin = image(2, 50, 500 * MIB);
        twin.id = "id1".into();
        let images = [image(1, 60, 500 * MIB), twin];
        assert!(gone(&images, &[], keeping(10, Some(600 * MIB))).is_empty());
    }

    #[test]
    fn a_mark_is_named_by_its_digests_hex() {
        let hex = "ab".repeat(32);
        assert_eq!(
            digest_of_mark(Path::new(&format!("/m/{hex}"))),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(digest_of_mark(Path::new("/m/.lock")), None);
        assert_eq!(
            digest_of_mark(Path::new(&format!("/m/{}", "AB".repeat(32)))),
            None
        );
    }
}
