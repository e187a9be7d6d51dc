//! Writes the CRD YAML into a directory (default `deploy/crds`), or with
//! `--check` fails when the files there differ from what the types generate.

use std::path::PathBuf;
use std::process::ExitCode;

use k8s4r_api::crd::{crds, to_yaml};

fn main() -> ExitCode {
    let mut check = false;
    let mut dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds"));
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "-h" | "--help" => {
                println!("usage: crdgen [--check] [DIR]\n  writes the k8s4r CRDs as YAML into DIR (default deploy/crds);\n  --check compares instead and fails on any difference");
                return ExitCode::SUCCESS;
            }
            other => dir = PathBuf::from(other),
        }
    }
    let mut stale = Vec::new();
    for (file, crd) in crds() {
        let yaml = match to_yaml(&crd) {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: cannot render {file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let path = dir.join(file);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
                stale.push(path.display().to_string());
            }
        } else if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, yaml)) {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", path.display());
        }
    }
    if stale.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "crdgen: these files differ from the Rust types; run `cargo run -p k8s4r-api --features kube --bin crdgen`:\n  {}",
            stale.join("\n  ")
        );
        ExitCode::FAILURE
    }
}
