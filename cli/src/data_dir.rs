//! What `k8s4r up` keeps in its data directory that other commands read
//! (they find the local cluster there when no kubeconfig says otherwise).

use std::path::{Path, PathBuf};

/// The path of the kubeconfig `up` writes.
pub fn kubeconfig_path(data_dir: &Path) -> PathBuf {
    data_dir.join("kubeconfig")
}
