//! A next release that starts but cannot reach the broker: the real agent,
//! its broker address replaced by a port nothing listens on (a build with
//! a broken TLS stack or broker setting behaves so).

fn main() -> std::process::ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The last of a flag given twice wins.
    args.push("--broker-url".into());
    args.push("mqtt://127.0.0.1:9".into());
    k8s4r_agent::cli::main_as(k8s4r_e2e::NEXT_VERSION, args)
}
