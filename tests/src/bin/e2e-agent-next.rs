//! The real agent, saying it is the next release
//! ([`k8s4r_e2e::NEXT_VERSION`]): what the upgrade tests roll out.
fn main() -> std::process::ExitCode {
    k8s4r_agent::cli::main_as(k8s4r_e2e::NEXT_VERSION, std::env::args_os().collect())
}
