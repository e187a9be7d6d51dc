//! The real agent (`k8s4r-agent`), built in this package so the end-to-end
//! tests can run it as a process through `CARGO_BIN_EXE_e2e-agent`.

fn main() -> std::process::ExitCode {
    k8s4r_agent::cli::main()
}
