//! Command-line arguments of the `apiserver-lite` binary.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// An embedded Kubernetes-compatible API server for k8s4r.
#[derive(Debug, Parser)]
#[command(name = "apiserver-lite", version)]
pub struct Args {
    /// Address to listen on (HTTPS with a self-signed certificate, which the
    /// kubeconfig written by --write-kubeconfig carries).
    #[arg(long, env = "K8S4R_APISERVER_BIND", default_value = "127.0.0.1:6443")]
    pub bind: SocketAddr,
    /// Directory of the redb file objects are kept in.
    #[arg(
        long,
        env = "K8S4R_APISERVER_DATA_DIR",
        default_value = "./apiserver-data",
        conflicts_with = "in_memory"
    )]
    pub data_dir: PathBuf,
    /// Keep everything in memory only; nothing survives a restart.
    #[arg(long, env = "K8S4R_APISERVER_IN_MEMORY")]
    pub in_memory: bool,
    /// The administrator's bearer token (may do everything); generated when
    /// not given.
    #[arg(long, env = "K8S4R_APISERVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// More users, as kube-apiserver reads them: one `token,user,uid[,"group1,group2"]`
    /// per line. Their requests are authorized by the stored RBAC Roles,
    /// ClusterRoles and bindings.
    #[arg(long, env = "K8S4R_APISERVER_TOKEN_AUTH_FILE")]
    pub token_auth_file: Option<PathBuf>,
    /// Write a kubeconfig for this server to this file once it listens.
    #[arg(long, env = "K8S4R_APISERVER_KUBECONFIG")]
    pub write_kubeconfig: Option<PathBuf>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "K8S4R_APISERVER_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Events kept for watches to resume from.
    #[arg(long, env = "K8S4R_APISERVER_HISTORY", default_value_t = 50_000)]
    pub history: usize,
    /// How long an Event is kept after it last happened (e.g. 1h, 30m; keep
    /// it above 6m, the time kube-rs's Recorder goes on patching an Event).
    #[arg(long, env = "K8S4R_APISERVER_EVENT_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub event_ttl: std::time::Duration,
    /// Log format.
    #[arg(long, env = "K8S4R_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log filter (RUST_LOG syntax); RUST_LOG is used when absent, else
    /// `info`. One that does not parse is an error.
    #[arg(long, env = "K8S4R_LOG")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve (the default).
    Serve,
    /// Measure write latency, watch delivery latency, throughput and memory on loopback.
    Bench {
        /// Objects created in the latency phase (paced at --rate per second).
        #[arg(long, env = "K8S4R_BENCH_OBJECTS", default_value_t = 2000)]
        objects: usize,
        /// Pace of the latency phase, writes per second.
        #[arg(long, env = "K8S4R_BENCH_RATE", default_value_t = 1000)]
        rate: u64,
        /// Writes in the throughput phase.
        #[arg(long, env = "K8S4R_BENCH_WRITES", default_value_t = 20_000)]
        writes: usize,
        /// Watchers attached during the benchmark.
        #[arg(long, env = "K8S4R_BENCH_WATCHERS", default_value_t = 10)]
        watchers: usize,
        /// Tasks stored in the memory phase (the figure is per 10,000).
        #[arg(long, env = "K8S4R_BENCH_MEMORY_TASKS", default_value_t = 10_000)]
        memory_tasks: usize,
    },
}

impl Args {
    /// A filter that does not parse is an error, as in the other k8s4r
    /// programs, not a silently ignored one.
    fn init_logging(&self) -> anyhow::Result<()> {
        use tracing_subscriber::EnvFilter;
        let rust_log = std::env::var("RUST_LOG").ok().filter(|f| !f.trim().is_empty());
        let filter = match (&self.log, rust_log) {
            (Some(f), _) => {
                EnvFilter::try_new(f).map_err(|e| anyhow::anyhow!("invalid --log filter {f:?}: {e}"))?
            }
            (None, Some(f)) => {
                EnvFilter::try_new(&f).map_err(|e| anyhow::anyhow!("invalid RUST_LOG filter {f:?}: {e}"))?
            }
            (None, None) => EnvFilter::new("info"),
        };
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        let _ = match self.log_format {
            LogFormat::Json => builder.json().try_init(),
            LogFormat::Text => builder.try_init(),
        };
        Ok(())
    }

    pub fn config(&self) -> anyhow::Result<crate::Config> {
        let mut c = crate::Config::default()
            .bind(self.bind)
            .max_body_bytes(self.max_body_bytes)
            .history(self.history)
            .event_ttl(self.event_ttl);
        if !self.in_memory {
            c = c.data_dir(self.data_dir.clone());
        }
        if let Some(t) = &self.token {
            c = c.token(t.clone());
        }
        if let Some(path) = &self.token_auth_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--token-auth-file {}: {e}", path.display()))?;
            c.users = crate::authz::parse_token_file(&text)
                .map_err(|e| anyhow::anyhow!("--token-auth-file {}: {e}", path.display()))?;
        }
        Ok(c)
    }

    pub async fn run(self) -> anyhow::Result<()> {
        self.init_logging()?;
        match self.command {
            Some(Command::Bench {
                objects,
                rate,
                writes,
                watchers,
                memory_tasks,
            }) => {
                let report = crate::bench::run(crate::bench::BenchConfig {
                    objects,
                    rate,
                    writes,
                    watchers,
                    memory_tasks,
                })
                .await?;
                for line in report.lines() {
                    println!("{line}");
                }
                Ok(())
            }
            None | Some(Command::Serve) => {
                let server = crate::start(self.config()?).await?;
                if let Some(path) = &self.write_kubeconfig {
                    server.write_kubeconfig(path)?;
                    tracing::info!(path = %path.display(), "kubeconfig written");
                }
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                tracing::info!("shutting down");
                server.shutdown().await?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn a_log_filter_that_does_not_parse_is_an_error() {
        let a = Args::parse_from(["apiserver-lite", "--log", "apiserver_lite=loud"]);
        let e = a.init_logging().unwrap_err().to_string();
        assert!(e.contains("--log") && e.contains("loud"), "{e}");
    }

    #[test]
    fn in_memory_config_has_no_data_dir() {
        let a = Args::parse_from(["apiserver-lite", "--in-memory", "--bind", "127.0.0.1:0"]);
        assert!(a.config().unwrap().data_dir.is_none());
    }
}
