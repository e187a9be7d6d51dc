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
    /// Non-mutating requests (get, list, discovery) served at once; more are
    /// answered 429 with `Retry-After: 1`. 0 for no limit. Watches are not
    /// counted, and system:masters (the --token) are served even over it, as
    /// by kube-apiserver's flag of this name.
    #[arg(long, env = "K8S4R_APISERVER_MAX_REQUESTS_INFLIGHT", default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// Mutating requests (create, update, patch, delete) served at once; more
    /// are answered 429. 0 for no limit.
    #[arg(
        long,
        env = "K8S4R_APISERVER_MAX_MUTATING_REQUESTS_INFLIGHT",
        default_value_t = 200
    )]
    pub max_mutating_requests_inflight: usize,
    /// Watches open at once, all users together; more are answered 429.
    #[arg(long, env = "K8S4R_APISERVER_MAX_WATCHES", default_value_t = 1000, value_parser = at_least_one)]
    pub max_watches: usize,
    /// Watches open at once for one user of --token-auth-file; more are
    /// answered 429.
    #[arg(long, env = "K8S4R_APISERVER_MAX_WATCHES_PER_USER", default_value_t = 250, value_parser = at_least_one)]
    pub max_watches_per_user: usize,
    /// Connections open at once (each watch holds one); more are closed as
    /// soon as they are accepted. Keep it below the open-files limit.
    #[arg(long, env = "K8S4R_APISERVER_MAX_CONNECTIONS", default_value_t = 2048, value_parser = at_least_one)]
    pub max_connections: usize,
    /// TLS handshakes under way at once; more wait for a turn.
    #[arg(long, env = "K8S4R_APISERVER_MAX_TLS_HANDSHAKES", default_value_t = 64, value_parser = at_least_one)]
    pub max_tls_handshakes: usize,
    /// How long a new connection has to complete its TLS handshake, waiting
    /// for a turn included; then it is closed.
    #[arg(long, env = "K8S4R_APISERVER_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub tls_handshake_timeout: std::time::Duration,
    /// How long a connection has to send a request's headers, counted from
    /// its handshake or its previous answer; then it is closed (so an idle
    /// keep-alive connection is closed after it too).
    #[arg(long, env = "K8S4R_APISERVER_HEADER_READ_TIMEOUT", default_value = "32s", value_parser = positive_duration)]
    pub header_read_timeout: std::time::Duration,
    /// How long a request's body may take to arrive after its headers; then
    /// the request is answered 408 and its in-flight slot is given back.
    #[arg(long, env = "K8S4R_APISERVER_BODY_READ_TIMEOUT", default_value = "60s", value_parser = positive_duration)]
    pub body_read_timeout: std::time::Duration,
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

/// A count for which 0 would mean "refuse everything"; those limits have
/// no "0 for none" in kube-apiserver either.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be longer than 0s".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
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

    pub fn limits(&self) -> crate::Limits {
        crate::Limits {
            max_requests_inflight: self.max_requests_inflight,
            max_mutating_requests_inflight: self.max_mutating_requests_inflight,
            max_watches: self.max_watches,
            max_watches_per_user: self.max_watches_per_user,
            max_connections: self.max_connections,
            max_tls_handshakes: self.max_tls_handshakes,
            tls_handshake_timeout: self.tls_handshake_timeout,
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
        }
    }

    pub fn config(&self) -> anyhow::Result<crate::Config> {
        let mut c = crate::Config::default()
            .bind(self.bind)
            .max_body_bytes(self.max_body_bytes)
            .history(self.history)
            .event_ttl(self.event_ttl)
            .limits(self.limits());
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
                match crate::limits::raise_open_files_limit() {
                    Ok(open_files) => tracing::debug!(open_files, "open-files limit"),
                    Err(e) => tracing::warn!(error = %e, "cannot read the open-files limit"),
                }
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
    fn default_flags_are_the_default_limits() {
        let a = Args::parse_from(["apiserver-lite"]);
        assert_eq!(a.limits(), crate::Limits::default());
    }

    #[test]
    fn limits_without_a_meaning_for_zero_refuse_it() {
        for flag in [
            "--max-watches",
            "--max-watches-per-user",
            "--max-connections",
            "--max-tls-handshakes",
        ] {
            let e = Args::try_parse_from(["apiserver-lite", flag, "0"])
                .unwrap_err()
                .to_string();
            assert!(e.contains("at least 1"), "{flag}: {e}");
        }
        for flag in ["--tls-handshake-timeout", "--header-read-timeout"] {
            assert!(
                Args::try_parse_from(["apiserver-lite", flag, "0s"]).is_err(),
                "{flag}"
            );
        }
        let a = Args::parse_from(["apiserver-lite", "--max-requests-inflight", "0"]);
        assert_eq!(
            a.limits().max_requests_inflight,
            0,
            "0 is kube-apiserver's 'no limit'"
        );
    }

    #[test]
    fn in_memory_config_has_no_data_dir() {
        let a = Args::parse_from(["apiserver-lite", "--in-memory", "--bind", "127.0.0.1:0"]);
        assert!(a.config().unwrap().data_dir.is_none());
    }
}
