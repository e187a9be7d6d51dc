//! Logging set-up shared by the k8s4r programs (agent, server, manager,
//! `k8s4r`), so that `--log`, `--log-format` and `RUST_LOG` mean the same
//! thing in each.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for the journal or a log shipper).
    Json,
}

/// A log filter that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?} (from {source_name}): {reason}")]
pub struct InvalidFilter {
    filter: String,
    source_name: &'static str,
    reason: String,
}

/// The filter of a program that sets no other default.
pub const DEFAULT_FILTER: &str = "info";

/// Where the filter comes from: `explicit` (a flag, its environment
/// variable or a config file) wins, then `RUST_LOG`, then the program's default.
fn choose(explicit: Option<&str>, rust_log: Option<&str>, default: &str) -> Result<EnvFilter, InvalidFilter> {
    let (filter, source_name) = match (explicit, rust_log.filter(|f| !f.trim().is_empty())) {
        (Some(f), _) => (f, "--log"),
        (None, Some(f)) => (f, "RUST_LOG"),
        (None, None) => (default, "the default"),
    };
    EnvFilter::try_new(filter).map_err(|e| InvalidFilter {
        filter: filter.to_owned(),
        source_name,
        reason: e.to_string(),
    })
}

/// Sends `tracing` output to standard error in `format`, filtered as
/// [`choose`] says. A filter that does not parse is an error rather than a
/// silent fallback. If a subscriber is set already (tests run several
/// programs in one process), the first one stays.
pub fn init(format: LogFormat, explicit: Option<&str>) -> Result<(), InvalidFilter> {
    init_with_default(format, explicit, DEFAULT_FILTER)
}

/// [`init`] for a program whose default filter is not [`DEFAULT_FILTER`].
pub fn init_with_default(
    format: LogFormat,
    explicit: Option<&str>,
    default: &str,
) -> Result<(), InvalidFilter> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = choose(explicit, rust_log.as_deref(), default)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_filter_wins_over_rust_log_which_wins_over_info() {
        let shown = |f: EnvFilter| f.to_string();
        assert_eq!(
            shown(choose(Some("debug"), Some("warn"), "info").unwrap()),
            "debug"
        );
        assert_eq!(shown(choose(None, Some("warn"), "info").unwrap()), "warn");
        assert_eq!(shown(choose(None, Some("  "), "info").unwrap()), "info");
        assert_eq!(shown(choose(None, None, "info").unwrap()), "info");
        assert_eq!(
            shown(choose(None, None, "info,rumqttd=off").unwrap()),
            "rumqttd=off,info"
        );
    }

    #[test]
    fn a_bad_filter_is_an_error_naming_where_it_came_from() {
        let e = choose(Some("k8s4r=loud"), None, "info").unwrap_err().to_string();
        assert!(e.contains("\"k8s4r=loud\"") && e.contains("--log"), "{e}");
        let e = choose(None, Some("=["), "info").unwrap_err().to_string();
        assert!(e.contains("RUST_LOG"), "{e}");
    }
}
