//! `k8s4r dashboard`: the fleet in a browser, served on loopback by this
//! process and acting with the user's own credentials (their kubeconfig,
//! or `k8s4r up`'s admin client), so that RBAC applies as it does to
//! kubectl. Server-rendered HTML ([`views`]), one small script that follows
//! the cluster's changes over server-sent events ([`live`]) and swaps the
//! page's content in place, every asset compiled into the binary.
//!
//! - [`state`]: the watches and caches of this one user, and what they may do;
//! - [`guard`]: who may talk to it (the Host header, a login token, a CSRF
//!   token on every form);
//! - [`views`], [`graph`]: the pages;
//! - [`actions`]: cancel, retry, cordon, uncordon, through exactly what
//!   `k8s4r cancel|retry|cordon|uncordon` do;
//! - [`live`]: change notices, and a task's live log;
//! - [`terminal`]: a shell in a running task, from its page (xterm.js).

mod actions;
mod graph;
mod guard;
mod live;
mod state;
mod terminal;
mod views;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use axum::routing::get;
use axum::Router;
use clap::Args as ClapArgs;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::operate::KubeArgs;
pub use state::State;

/// The dashboard's default address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8484";

/// `k8s4r dashboard`.
#[derive(Debug, Clone, ClapArgs)]
pub struct DashboardArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Jobs and Tasks of every namespace, not only -n's.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Where to serve it. Anything but a loopback address lets whoever
    /// reaches it, with the printed URL, act as you.
    #[arg(long, env = "K8S4R_DASHBOARD_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Open the dashboard in a browser (xdg-open), through a file only you
    /// can read: the login token never appears on a command line.
    #[arg(long)]
    pub open: bool,
}

/// What a dashboard serves and as whom.
pub struct Config {
    /// The user's client: every read and write is made with it.
    pub client: Client,
    /// Jobs and Tasks of this namespace; all when `None`.
    pub namespace: Option<String>,
    pub listen: SocketAddr,
}

/// A dashboard that is serving.
pub struct Served {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The URL to open: it carries the login token.
    pub url: String,
}

/// Runs `k8s4r dashboard` until Ctrl-C.
pub async fn run(args: DashboardArgs, data_dir: &Path) -> anyhow::Result<()> {
    let (client, ns) = args.kube.connect(data_dir).await?;
    let config = Config {
        client,
        namespace: (!args.all_namespaces).then_some(ns),
        listen: args.listen,
    };
    let shutdown = CancellationToken::new();
    let served = serve(config, shutdown.clone()).await?;
    if !served.addr.ip().is_loopback() {
        eprintln!(
            "warning: the dashboard listens on {}: anyone who reaches it and has the URL acts as you, \
             with your credentials, over plain HTTP. Prefer the default ({DEFAULT_LISTEN}) and \
             `ssh -L 8484:127.0.0.1:8484` from another machine.",
            served.addr
        );
    }
    println!("k8s4r dashboard: {}", served.url);
    println!("(the URL carries a login token; Ctrl-C to stop)");
    let opener = match args.open {
        true => Some(open_in_browser(data_dir, served.addr.port(), &served.url)?),
        false => None,
    };
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    shutdown.cancel();
    if let Some(file) = opener {
        let _ = std::fs::remove_file(file);
    }
    Ok(())
}

/// Hands the browser a file that sends it on to `url`, never `url` itself:
/// a command line is readable by every local user (`/proc/<pid>/cmdline`),
/// and the URL carries the login token. The file is readable by its owner
/// only; the dashboard removes it when it stops. (Jupyter opens its
/// token-bearing URL the same way.)
fn open_in_browser(data_dir: &Path, port: u16, url: &str) -> anyhow::Result<std::path::PathBuf> {
    let file = write_redirect(data_dir, port, url)?;
    std::process::Command::new("xdg-open")
        .arg(&file)
        .spawn()
        .context("start xdg-open to open the dashboard (or open the printed URL yourself)")?;
    Ok(file)
}

/// Writes `<data_dir>/dashboard-<port>.html`, mode 0600 from its creation
/// (apiserver-lite's private files, as the kubeconfig), that redirects to `url`.
fn write_redirect(data_dir: &Path, port: u16, url: &str) -> anyhow::Result<std::path::PathBuf> {
    apiserver_lite::private_files::create_dir(data_dir)
        .with_context(|| format!("create {}", data_dir.display()))?;
    let path = data_dir.join(format!("dashboard-{port}.html"));
    let url = maud::html! { (url) }.into_string();
    let page = format!(
        "<!doctype html><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"0;url={url}\">\
         <title>k8s4r dashboard</title><a href=\"{url}\">Open the k8s4r dashboard</a>\n"
    );
    apiserver_lite::private_files::write(&path, page.as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// Starts serving `config` until `shutdown`; returns once it listens.
pub async fn serve(config: Config, shutdown: CancellationToken) -> anyhow::Result<Served> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} for the dashboard", config.listen))?;
    let addr = listener.local_addr().context("the dashboard's address")?;
    let state = Arc::new(State::start(config.client, config.namespace, addr, &shutdown).await?);
    let url = format!("http://{}/?token={}", url_host(addr), state.login_token());
    let app = router(state);
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(e) = served.await {
            tracing::error!(error = %e, "the dashboard stopped");
        }
    });
    Ok(Served { addr, url })
}

/// How a browser should name `addr`.
fn url_host(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => format!("127.0.0.1:{}", a.port()),
        SocketAddr::V6(a) if a.ip().is_unspecified() => format!("[::1]:{}", a.port()),
        a => a.to_string(),
    }
}

fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(views::home))
        .route("/fleet", get(views::fleet))
        .route("/robots/{name}", get(views::robot))
        .route(
            "/robots/{name}/{action}",
            get(actions::robot_form).post(actions::robot_action),
        )
        .route("/jobs", get(views::jobs))
        .route("/rollouts", get(views::rollouts))
        .route("/ns/{ns}/jobs/{name}", get(views::job))
        .route("/ns/{ns}/tasks/{name}", get(views::task))
        .route("/ns/{ns}/tasks/{name}/log", get(live::log))
        .route("/ns/{ns}/tasks/{name}/outputs", get(views::output))
        .route("/ns/{ns}/tasks/{name}/terminal", get(terminal::terminal))
        .route(
            "/ns/{ns}/{kind}/{name}/{action}",
            get(actions::work_form).post(actions::work_action),
        )
        .route("/live", get(live::changes))
        .route("/assets/{file}", get(views::asset))
        .route("/healthz", get(views::healthz))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::guard))
        .with_state(state)
}

#[cfg(test)]
mod open_tests {
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_browser_gets_a_private_file_not_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let url = "http://127.0.0.1:8484/?token=abc123";
        let path = super::write_redirect(dir.path(), 8484, url).unwrap();
        // What goes on xdg-open's command line: the path, without the token.
        assert!(!path.to_string_lossy().contains("abc123"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let page = std::fs::read_to_string(&path).unwrap();
        assert!(
            page.contains("content=\"0;url=http://127.0.0.1:8484/?token=abc123\""),
            "{page}"
        );
        // Written again (a second run on the same port), still private.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let again = super::write_redirect(dir.path(), 8484, url).unwrap();
        assert_eq!(
            std::fs::metadata(&again).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
