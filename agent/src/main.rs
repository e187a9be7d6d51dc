//! `k8s4r-agent`: parses its arguments and runs the agent library.

fn main() -> std::process::ExitCode {
    k8s4r_agent::cli::main()
}
