//! The `k8s4r-agent` command: parses its arguments and runs the agent.

use std::process::ExitCode;

use crate::config::{Args, Config};
use crate::upgrade::verify::Trust;
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The `k8s4r-agent` program: what its `main` does, for any binary that
/// should behave exactly like it (the end-to-end tests run one).
pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = run_helper(&args) {
        return code;
    }
    run_main(Args::parse_from(args))
}

/// The `k8s4r-agent` program, saying it is `version` (`--version`, its
/// registrations) and reading `args` instead of the process's own: for a
/// binary built to stand for another release.
pub fn main_as(version: &'static str, args: Vec<std::ffi::OsString>) -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    if let Some(code) = run_helper(&args) {
        return code;
    }
    let _ = crate::VERSION.set(version);
    let matches = Args::command().version(version).get_matches_from(args);
    match Args::from_arg_matches(&matches) {
        Ok(args) => run_main(args),
        Err(e) => e.exit(),
    }
}

/// The binary started as a task's shim or logger (`args` with the program
/// name): that, and nothing of the agent. Any binary that hosts the agent
/// (`k8s4r up`) calls it first, to serve as its tasks' helpers too.
pub fn run_helper(args: &[std::ffi::OsString]) -> Option<ExitCode> {
    match args.get(1).and_then(|a| a.to_str()) {
        Some(k8s4r_drivers::shim::FLAG) => k8s4r_drivers::shim::main(&args[1..]),
        Some(k8s4r_drivers::shim::LOGGER_FLAG) => Some(crate::logger::main(&args[2..])),
        Some(HELPER_PROBE) => {
            println!("{HELPER_PROBE_ANSWER}");
            Some(ExitCode::SUCCESS)
        }
        _ => None,
    }
}

/// Asks this binary, run again, whether it can be its tasks' helpers.
const HELPER_PROBE: &str = "--task-helper-probe";
const HELPER_PROBE_ANSWER: &str = "k8s4r task helpers";

/// This binary, if the machine can run it again as its tasks' shim and
/// logger. Where it cannot (an emulator such as qemu-user with no
/// binfmt_misc entry, which runs the agent but cannot exec it again),
/// tasks are the supervisor's own children and do not outlive it: said
/// once, as a warning.
pub fn own_binary_as_helpers() -> Option<std::path::PathBuf> {
    let program = std::path::PathBuf::from("/proc/self/exe");
    let answer = std::process::Command::new(&program)
        .arg(HELPER_PROBE)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    match answer {
        Ok(out) if out.status.success() && out.stdout.trim_ascii() == HELPER_PROBE_ANSWER.as_bytes() => {
            Some(program)
        }
        _ => {
            tracing::warn!(
                "this machine cannot run the agent's binary again (an emulator?): tasks run as the agent's \
                 children, without a shim or a logger, and do not outlive it"
            );
            None
        }
    }
}

fn run_main(args: Args) -> ExitCode {
    let check_only = args.check_config;
    let stop_left = args.stop_left_tasks;
    let boot_check = args.boot_check;
    let config = match args.load() {
        Ok(config) if boot_check => return run_boot_check(&config),
        Ok(_) if stop_left && crate::unit::how_it_ends() == crate::unit::UnitEnd::Restarts => {
            println!("k8s4r-agent: the unit restarts: its tasks are left running for the next agent");
            return ExitCode::SUCCESS;
        }
        Ok(config) if stop_left => {
            return match crate::supervisor::stop_left_tasks(&config.supervisor.state_dir) {
                Ok(n) => {
                    println!("k8s4r-agent: {n} task(s) left by the agent stopped");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("k8s4r-agent: cannot read the journal: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Ok(config) if check_only => {
            print_checked(&config);
            return ExitCode::SUCCESS;
        }
        Ok(config) => config,
        Err(e) => {
            eprintln!("k8s4r-agent: {e}");
            return ExitCode::from(2);
        }
    };
    // Logging never blocks: a log line must not hold up a task's deadline
    // when standard error (the journal, a file) stalls with the disk.
    let _log = match k8s4r_api::logging::init_non_blocking(config.log_format, config.log.as_deref()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("k8s4r-agent: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread: the agent's work is I/O-bound and small, and every extra
    // worker thread costs memory on a robot.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("k8s4r-agent: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--boot-check`: never fails the start it precedes (a failed boot
/// check must not keep the confirmed agent from starting either).
fn run_boot_check(config: &Config) -> ExitCode {
    use crate::upgrade::slots::{BootCheck, Slots};
    match Slots::new(&config.state_dir).boot_check(std::time::SystemTime::now()) {
        Ok(BootCheck::Settled) => {}
        Ok(BootCheck::OnTrial(trial)) => println!(
            "k8s4r-agent: boot check: {} on trial, start {} of {}",
            trial.to_version,
            trial.starts,
            crate::upgrade::slots::MAX_TRIAL_STARTS
        ),
        Ok(BootCheck::RolledBack(outcome)) => println!(
            "k8s4r-agent: boot check: upgrade to {} rolled back: {}",
            outcome.version,
            outcome.reason.as_deref().unwrap_or("")
        ),
        Err(e) => eprintln!("k8s4r-agent: boot check: {e}"),
    }
    ExitCode::SUCCESS
}

/// What `--check-config` prints about a usable configuration: where the
/// agent connects, what it writes where, and where its token comes from.
fn print_checked(config: &Config) {
    println!(
        "k8s4r-agent: configuration ok: robot {}, broker {}:{}{}, drivers {}",
        config.robot_id,
        config.broker.host,
        config.broker.port,
        if config.broker.tls.is_some() { " (TLS)" } else { "" },
        if config.supervisor.policy.raw_exec {
            "exec, raw_exec"
        } else {
            "exec"
        }
    );
    println!("k8s4r-agent: {}", config.state_layout());
    let token = match (&config.token_file, &config.token) {
        (Some(file), _) => format!("read from {}", file.display()),
        (None, Some(_)) => "set (a --token flag shows in `ps` to every user of the machine: \
                           prefer token_file)"
            .to_owned(),
        (None, None) => "none: the cluster rejects a robot without one (set token_file)".to_owned(),
    };
    println!("k8s4r-agent: bootstrap token {token}");
    let upgrades = match &config.upgrade_trust {
        Trust::Keys(keys) => format!("accepted when signed by one of {} pinned key(s)", keys.len()),
        Trust::UnsignedAllowed => {
            "accepted unsigned (allow_unsigned_upgrades; the sha256 is still checked)".into()
        }
        Trust::Nothing => "refused: no upgrade_public_keys pinned".into(),
    };
    println!("k8s4r-agent: agent upgrades {upgrades}");
}

async fn run(mut config: Config) -> anyhow::Result<()> {
    // This process starts no children but its tasks: every zombie it
    // inherits as their subreaper is theirs.
    config.supervisor.reap_all_orphans = true;
    // An agent restart (an upgrade) re-adopts its services.
    config.supervisor.leave_tasks_running = true;
    // Tasks run under this binary as their shim, so that they outlive it
    // with their exit status kept.
    config.supervisor.shim_program = own_binary_as_helpers();
    let shutdown = CancellationToken::new();
    let (handle, session) = crate::agent::start(&config, shutdown.clone())?;
    tokio::spawn(signals(shutdown));
    session.await?;
    // Exit non-zero when the supervisor died: systemd restarts the agent.
    if let Some(why) = handle.failure() {
        anyhow::bail!(why);
    }
    Ok(())
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; stop the agent with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    shutdown.cancel();
}
