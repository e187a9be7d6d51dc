//! A broken build of the next release: it answers `--version` as the real
//! one would (so it passes the robot's checks) and exits at every start.

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.iter().any(|a| a == "--version") {
        return k8s4r_agent::cli::main_as(k8s4r_e2e::NEXT_VERSION, args);
    }
    eprintln!("e2e-agent-crash: exits at start, as a broken build would");
    std::process::ExitCode::from(1)
}
