//! `k8s4r`: the whole stack on one machine (`k8s4r up`), small helpers
//! around it (`crds`, `kubeconfig`), and the operator's commands that work
//! on any cluster (`logs`, `retry`, `cancel`, `cordon`, `uncordon`,
//! `drain`).

pub mod broker;
pub mod dashboard;
pub mod data_dir;
pub mod drain;
pub mod error;
pub mod image;
pub mod join;
pub mod logs;
pub mod operate;
pub mod outputs;
pub mod progress;
pub mod reach;
pub mod secret;
pub mod sign;
pub mod status;
pub mod up;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use k8s4r_api::logging::LogFormat;

pub use error::UpError;

/// `k8s4r`'s log filter when neither `--log` nor RUST_LOG sets one.
const DEFAULT_LOG: &str = "info,rumqttd=off";
/// The same for `up --demo`, whose terminal is for the job's progress.
const DEMO_LOG: &str = "warn,rumqttd=off";

/// Kubernetes for robot fleets: run the whole k8s4r stack on this machine.
#[derive(Debug, Parser)]
#[command(name = "k8s4r", version, propagate_version = true)]
pub struct Args {
    /// Where `up` keeps its state: the API server's database, the
    /// kubeconfig, the local agent's state. Default: $XDG_DATA_HOME/k8s4r or
    /// ~/.local/share/k8s4r.
    #[arg(long, global = true, env = "K8S4R_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "K8S4R_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log filter (RUST_LOG syntax, e.g. `k8s4r_manager=debug,info`);
    /// without it RUST_LOG applies, else `info,rumqttd=off` (the embedded
    /// broker logs every connection at info and every clean disconnect as
    /// an error; `--log info` shows them), and with `up --demo`
    /// `warn,rumqttd=off`, so that the terminal shows the job's progress.
    #[arg(long, global = true, env = "K8S4R_LOG")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the embedded API server, MQTT broker, server, manager and a local
    /// agent in this process, until Ctrl-C.
    Up(up::UpArgs),
    /// Print the k8s4r CRDs as YAML (for `kubectl apply -f -`).
    Crds,
    /// Print the path of the kubeconfig `up` writes, or with --print its contents.
    Kubeconfig {
        /// Print the file's contents instead of its path.
        #[arg(long)]
        print: bool,
    },
    /// Print a task's output, read from its robot (like `kubectl logs`):
    /// live with -f, the last lines with --tail; a robot that is offline
    /// is said so, with the last output the cluster has.
    Logs(logs::LogsArgs),
    /// List the files a task's robot uploaded (its `outputs`: path, size,
    /// state, object key or why it was dropped), or download one through
    /// the cluster with --get PATH, checked against its sha256.
    Outputs(outputs::OutputsArgs),
    /// Run a command inside a running task (its user, directory,
    /// environment and limits), or on a robot (`robot/NAME`, as the user
    /// its agent names), like `kubectl exec`: -i passes stdin, -t gives it
    /// a terminal; the exit status is the command's.
    Exec(reach::ExecArgs),
    /// Forward local ports to ports on a task's robot (or `robot/NAME`)'s
    /// loopback, through the cluster, like `kubectl port-forward`.
    PortForward(reach::PortForwardArgs),
    /// Copy a file to or from a running task (TASK:PATH) or a robot
    /// (robot/NAME:PATH), like `kubectl cp`.
    Cp(reach::CpArgs),
    /// Container images on robots: `k8s4r image push robot/NAME IMAGE`
    /// copies one to robots that cannot reach a registry.
    Image {
        #[command(subcommand)]
        command: image::ImageCommand,
    },
    /// Start a new attempt of a failed or cancelled Task (or of every such
    /// Task of a TaskGroup or Job), its retry budget counted afresh: sets
    /// the robot.k8s4r.io/retry annotation, as `kubectl annotate` would.
    Retry(operate::ManualArgs),
    /// Stop a Task, TaskGroup or Job (its processes through the usual
    /// SIGTERM, then SIGKILL) and mark it cancelled, keeping it and its
    /// history: sets the robot.k8s4r.io/cancel annotation.
    Cancel(operate::ManualArgs),
    /// Mark a robot unschedulable: no new task is placed on it; what runs
    /// there goes on (sets the Robot's spec.unschedulable).
    Cordon(drain::RobotArgs),
    /// Mark a robot schedulable again.
    Uncordon(drain::RobotArgs),
    /// Print the command that joins another robot to the cluster `up`
    /// runs, or write a ready agent.toml (--write-config).
    JoinCommand(join::JoinArgs),
    /// One screen on the cluster: robots per phase, jobs per state, and
    /// the most common reasons tasks wait.
    Status(status::StatusArgs),
    /// The client's version and commit, and the API server's if it answers.
    Version(status::VersionArgs),
    /// Take a robot out of service: cordon it, stop its batch tasks
    /// gracefully (their preStop, their stop signal) so that they run
    /// elsewhere without using a retry, and wait until it holds nothing.
    /// Its services are left running unless --services stop. Tasks of
    /// every namespace unless -n names one.
    Drain(drain::DrainArgs),
    /// Make the key pair that signs agent upgrades (--generate), or sign
    /// an agent binary for an AgentRollout: writes BINARY.minisig and
    /// prints the rollout's artifact entry.
    SignAgent(sign::SignArgs),
    /// Serve the dashboard: the fleet, jobs, tasks and their live output
    /// in a browser, on loopback, acting with your kubeconfig's
    /// credentials. Prints the URL to open (it carries a login token).
    Dashboard(dashboard::DashboardArgs),
}

/// The program: parses the arguments and runs the command on a tokio
/// runtime. It lives here, not in `main.rs`, so that the whole program's
/// async code is compiled once, in this crate: a `#[tokio::main]` in the
/// binary made rustc generate every future `run` awaits a second time in
/// the binary crate (about 45 s of a clean release build on 2 cores).
/// The `k8s4r` program: a task's shim or logger when `k8s4r up`'s agent
/// starts it as one, else the command line; the exit code says how it
/// went (`k8s4r logs` that printed only the cluster's last output: 3).
pub fn program() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = k8s4r_agent::cli::run_helper(&args) {
        return code;
    }
    match main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<reach::RemoteExit>().is_some() => {
            let code = error.downcast_ref::<reach::RemoteExit>().map_or(1, |e| e.0);
            std::process::ExitCode::from(code)
        }
        Err(error) => {
            eprintln!("Error: {error:?}");
            if error.downcast_ref::<logs::Partial>().is_some() {
                std::process::ExitCode::from(logs::EXIT_PARTIAL)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

pub fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let result = runtime.block_on(args.run());
    // A read of a terminal's stdin (`k8s4r exec -i`) blocks a thread until
    // a key is pressed: the command is over, it is not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    result
}

impl Args {
    /// Runs the chosen command.
    pub async fn run(self) -> anyhow::Result<()> {
        let data_dir = match self.data_dir {
            Some(dir) => dir,
            None => default_data_dir()?,
        };
        match self.command {
            Command::Crds => {
                print!("{}", k8s4r_api::crd::all_yaml()?);
                Ok(())
            }
            Command::Kubeconfig { print } => {
                let path = up::kubeconfig_path(&data_dir);
                if !path.exists() {
                    return Err(UpError::NoKubeconfig(path).into());
                }
                if print {
                    print!("{}", std::fs::read_to_string(&path)?);
                } else {
                    println!("{}", path.display());
                }
                Ok(())
            }
            Command::Logs(args) => logs::run(args, &data_dir).await,
            Command::Outputs(args) => outputs::run(args, &data_dir).await,
            Command::Exec(args) => reach::exec(args, &data_dir).await,
            Command::PortForward(args) => reach::port_forward(args, &data_dir).await,
            Command::Cp(args) => reach::cp(args, &data_dir).await,
            Command::Image { command } => image::run(command, &data_dir).await,
            Command::Retry(args) => operate::run(operate::Manual::Retry, args, &data_dir).await,
            Command::Cancel(args) => operate::run(operate::Manual::Cancel, args, &data_dir).await,
            Command::Cordon(args) => drain::cordon(args, true, &data_dir).await,
            Command::Uncordon(args) => drain::cordon(args, false, &data_dir).await,
            Command::Drain(args) => drain::drain(args, &data_dir).await,
            Command::SignAgent(args) => sign::run(&args),
            Command::Dashboard(args) => dashboard::run(args, &data_dir).await,
            Command::JoinCommand(args) => join::run(args, &data_dir),
            Command::Status(args) => status::status(args, &data_dir).await,
            Command::Version(args) => status::version(args, &data_dir).await,
            Command::Up(args) => {
                let default = if args.demo { DEMO_LOG } else { DEFAULT_LOG };
                k8s4r_api::logging::init_with_default(self.log_format, self.log.as_deref(), default)?;
                up::run(args, data_dir).await
            }
        }
    }
}

fn default_data_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("k8s4r"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/k8s4r")),
        None => anyhow::bail!("neither XDG_DATA_HOME nor HOME is set: pass --data-dir"),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn args_are_consistent() {
        super::Args::command().debug_assert();
    }
}
