//! Checks of a template's container fields (`image`, `network`,
//! `devices`): required or refused by its driver.

use std::collections::BTreeSet;

use super::Report;
use crate::container::{check_device, ImageRef, MAX_DEVICES};
use crate::task::{TaskTemplate, DRIVER_PODMAN};

pub(super) fn check(report: &mut Report, path: &str, t: &TaskTemplate) {
    if t.driver != DRIVER_PODMAN {
        for (field, set) in [
            ("image", t.image.is_some()),
            ("network", t.network.is_some()),
            ("devices", !t.devices.is_empty()),
        ] {
            if set {
                report.error(
                    format!("{path}.{field}"),
                    format!(
                        "only for the podman driver (this task's driver is {:?})",
                        t.driver
                    ),
                );
            }
        }
        return;
    }
    match t.image.as_deref() {
        None => report.error(format!("{path}.image"), "required by the podman driver"),
        Some(image) => {
            if let Err(why) = ImageRef::parse(image) {
                report.error(format!("{path}.image"), why);
            }
        }
    }
    if t.command.contains('\0') {
        report.error(format!("{path}.command"), "must not contain NUL");
    }
    if t.devices.len() > MAX_DEVICES {
        report.error(
            format!("{path}.devices"),
            format!("at most {MAX_DEVICES} devices"),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, device) in t.devices.iter().enumerate() {
        if let Err(why) = check_device(device) {
            report.error(format!("{path}.devices[{i}]"), why);
        } else if !seen.insert(device.as_str()) {
            report.error(
                format!("{path}.devices[{i}]"),
                format!("duplicate device {device:?}"),
            );
        }
    }
}
