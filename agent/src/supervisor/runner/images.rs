//! The runner's side of removing the images no task needs (robots that
//! offer podman): at start, after a podman task's attempt ends, and every
//! hour. The digests the held tasks name are read here, on the loop; the
//! podman calls (seconds each) and the removals run on the blocking pool,
//! one collection at a time. The policy is `k8s4r_drivers::podman::images`.

use std::collections::HashSet;

use k8s4r_api::container::ImageRef;
use k8s4r_drivers::podman::images::{self, Collected, Policy};

use super::*;
use crate::supervisor::DiskSize;

/// Between two collections when no podman task ends.
const EVERY: Duration = Duration::from_secs(3600);

/// Whether a collection runs, and whether another is due after it.
#[derive(Debug, Default)]
pub(crate) struct ImageCollection {
    running: bool,
    again: bool,
    next: Option<Instant>,
}

impl Runner {
    /// A collection `after` from now, unless one is due sooner.
    pub(in crate::supervisor) fn schedule_images(&mut self, after: Duration) {
        if self.config.podman.is_none() {
            return;
        }
        let at = Instant::now() + after;
        if self.images.next.is_some_and(|next| next <= at) {
            return;
        }
        self.images.next = Some(at);
        self.table.schedule(Deadline::Images, after);
    }

    /// Removes the unused images the policy lets go (or notes that it
    /// should once the one under way is done).
    pub(super) fn collect_images(&mut self) {
        let Some(podman) = self.config.podman.clone() else {
            return;
        };
        self.images.next = None;
        if self.images.running {
            self.images.again = true;
            return;
        }
        self.images.running = true;
        // Every held task's image, whatever its phase: preparing (its
        // pull), waiting for its start conditions or for a restart.
        let referenced: HashSet<String> = self
            .table
            .tasks()
            .filter_map(|(_, t)| ImageRef::parse(t.template.image.as_deref()?).ok())
            .map(|image| image.digest)
            .collect();
        let (keep, budget) = (self.config.image_keep, self.config.image_budget);
        self.offload_with(move || {
            let driver = k8s4r_drivers::PodmanDriver::new(podman);
            let held = driver.images_held();
            let budget = match budget {
                DiskSize::Bytes(bytes) => Some(bytes),
                share => driver
                    .store_root()
                    .and_then(|root| crate::host::disk_space(&root))
                    .map(|(total, _)| share.of(total)),
            };
            let now = std::time::SystemTime::now();
            let plan = images::plan(&held, &referenced, Policy { keep, budget }, now);
            let doomed = plan.into_iter().map(|(i, why)| (held[i].clone(), why)).collect();
            Housework::ImagesCollected(driver.remove_images(doomed, now))
        });
    }

    pub(super) fn on_images_collected(&mut self, collected: Collected) {
        for (image, why) in &collected.removed {
            tracing::info!(image = %image.pinned, bytes = image.size, %why, "unused image removed");
        }
        for (image, why) in &collected.kept {
            tracing::info!(image = %image.pinned, %why, "unused image kept for now");
        }
        self.images.running = false;
        if std::mem::take(&mut self.images.again) {
            self.collect_images();
        } else {
            self.schedule_images(EVERY);
        }
    }
}
