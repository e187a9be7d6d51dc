//! A next release that hangs: the real agent, which stops itself (SIGSTOP)
//! a moment after it starts, before the cluster can confirm it, as a build
//! that deadlocks at start would. Its `--version` answers as the real one,
//! so it passes the robot's checks. Only systemd's watchdog sees it: the
//! agent's own trial deadline is in the process that hangs.

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if !args.iter().any(|a| a == "--version") {
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            eprintln!("e2e-agent-hang: stopping itself, as a hung build would");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        });
    }
    k8s4r_agent::cli::main_as(k8s4r_e2e::NEXT_VERSION, args)
}
