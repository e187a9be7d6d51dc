//! Parses the vendored Kubernetes `.proto` files (proto/) into a
//! descriptor set for src/protobuf.rs.

use std::error::Error;
use std::path::{Path, PathBuf};

fn protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let root = Path::new("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut inputs = Vec::new();
    protos(root, &mut inputs)?;
    inputs.sort();
    let set = protobuf_parse::Parser::new()
        .pure()
        .include(root)
        .inputs(&inputs)
        .file_descriptor_set()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("kubernetes.fds");
    std::fs::write(out, protobuf::Message::write_to_bytes(&set)?)?;
    Ok(())
}
