//! `k8s4r join-command`: how another robot joins the cluster `k8s4r up`
//! runs — the agent's command line, or a ready `agent.toml` — with the
//! broker `up` serves and the bootstrap token file it keeps.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Args as ClapArgs;
use k8s4r_api::validation::{validate_label_key, validate_label_value, validate_robot_id};

/// What `--robot` stands for when it is not given.
pub const ROBOT_PLACEHOLDER: &str = "ROBOT_ID";

/// `k8s4r join-command`.
#[derive(Debug, Clone, ClapArgs)]
pub struct JoinArgs {
    /// The new robot's id (default: a placeholder to replace).
    #[arg(long)]
    pub robot: Option<String>,
    /// A label of the new robot, as key=value (repeat or comma-separate).
    #[arg(long = "label", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Write a ready agent.toml to this file instead of printing the
    /// command (needs --robot); start the agent with
    /// `k8s4r-agent --config FILE`.
    #[arg(long, value_name = "FILE", requires = "robot")]
    pub write_config: Option<PathBuf>,
    /// The broker the robot connects to (default: the one `k8s4r up`
    /// serves; from another machine, this machine's address, with `up`
    /// listening there: `--mqtt-bind 0.0.0.0:1883`).
    #[arg(long)]
    pub broker_url: Option<String>,
    /// Where the agent keeps its state (default: robots/ID under the data
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Where `up` notes the broker URL it serves, for `join-command`.
pub fn broker_url_path(data_dir: &Path) -> PathBuf {
    data_dir.join("broker-url")
}

/// Where `up` keeps the bootstrap token.
pub fn token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("bootstrap-token")
}

/// The settings of an agent that joins `up`'s cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// The robot id.
    pub robot: String,
    /// The broker URL.
    pub broker_url: String,
    /// The bootstrap token file.
    pub token_file: PathBuf,
    /// The agent's state directory.
    pub state_dir: PathBuf,
    /// Labels, key and value.
    pub labels: Vec<(String, String)>,
}

impl Recipe {
    /// The recipe for `robot` (or the placeholder) with `up`'s data
    /// directory and broker.
    pub fn new(data_dir: &Path, broker_url: &str, robot: Option<&str>) -> Recipe {
        let robot = robot.unwrap_or(ROBOT_PLACEHOLDER).to_owned();
        Recipe {
            state_dir: data_dir.join("robots").join(&robot),
            robot,
            broker_url: broker_url.to_owned(),
            token_file: token_path(data_dir),
            labels: Vec::new(),
        }
    }

    /// The agent's command line.
    pub fn command(&self) -> String {
        let mut line = format!(
            "k8s4r-agent --robot-id {} --broker-url {} --token-file {} --state-dir {}",
            shell_word(&self.robot),
            shell_word(&self.broker_url),
            shell_word(&self.token_file.to_string_lossy()),
            shell_word(&self.state_dir.to_string_lossy()),
        );
        for (k, v) in &self.labels {
            let _ = write!(line, " --label {}", shell_word(&format!("{k}={v}")));
        }
        line
    }

    /// The same as an agent.toml.
    pub fn agent_toml(&self) -> String {
        let quote = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let mut text =
            String::from("# Written by `k8s4r join-command`; start with `k8s4r-agent --config FILE`.\n");
        let _ = writeln!(text, "robot_id = {}", quote(&self.robot));
        let _ = writeln!(text, "broker_url = {}", quote(&self.broker_url));
        let _ = writeln!(text, "token_file = {}", quote(&self.token_file.to_string_lossy()));
        let _ = writeln!(text, "state_dir = {}", quote(&self.state_dir.to_string_lossy()));
        if !self.labels.is_empty() {
            text.push_str("\n[labels]\n");
            for (k, v) in &self.labels {
                let _ = writeln!(text, "{} = {}", quote(k), quote(v));
            }
        }
        text
    }
}

/// `word` as one shell word.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Parses `key=value` labels, refusing what a Robot's labels may not hold.
pub fn parse_labels(labels: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    labels
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let Some((k, v)) = l.split_once('=') else {
                bail!("label {l:?} is not key=value");
            };
            validate_label_key(k).map_err(|e| anyhow::anyhow!("label {l:?}: {e}"))?;
            validate_label_value(v).map_err(|e| anyhow::anyhow!("label {l:?}: {e}"))?;
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Prints the command, or writes the agent.toml.
pub fn run(args: JoinArgs, data_dir: &Path) -> anyhow::Result<()> {
    if let Some(robot) = &args.robot {
        validate_robot_id(robot).map_err(|e| anyhow::anyhow!("--robot {robot:?}: {e}"))?;
    }
    let broker_url = match &args.broker_url {
        Some(url) => url.clone(),
        None => {
            let path = broker_url_path(data_dir);
            std::fs::read_to_string(&path)
                .with_context(|| {
                    format!(
                        "reading {} (run `k8s4r up` first with the same --data-dir, or pass --broker-url)",
                        path.display()
                    )
                })?
                .trim()
                .to_owned()
        }
    };
    if !token_path(data_dir).exists() {
        bail!(
            "no bootstrap token at {}: run `k8s4r up` first (with the same --data-dir)",
            token_path(data_dir).display()
        );
    }
    let mut recipe = Recipe::new(data_dir, &broker_url, args.robot.as_deref());
    recipe.labels = parse_labels(&args.labels)?;
    if let Some(dir) = args.state_dir {
        recipe.state_dir = dir;
    }
    match &args.write_config {
        Some(path) => {
            std::fs::write(path, recipe.agent_toml())
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!(
                "wrote {}; start the robot with: k8s4r-agent --config {}",
                path.display(),
                shell_word(&path.to_string_lossy())
            );
        }
        None => println!("{}", recipe.command()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> Recipe {
        let mut r = Recipe::new(Path::new("/data dir"), "mqtt://127.0.0.1:1883", Some("arm-1"));
        r.labels = vec![("site".into(), "lab".into())];
        r
    }

    #[test]
    fn the_command_quotes_what_the_shell_would_split() {
        assert_eq!(
            recipe().command(),
            "k8s4r-agent --robot-id arm-1 --broker-url mqtt://127.0.0.1:1883 --token-file '/data dir/bootstrap-token' --state-dir '/data dir/robots/arm-1' --label site=lab"
        );
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_config_names_the_agents_settings() {
        let text = recipe().agent_toml();
        assert!(text.contains("robot_id = \"arm-1\"\n"), "{text}");
        assert!(
            text.contains("token_file = \"/data dir/bootstrap-token\"\n"),
            "{text}"
        );
        assert!(text.contains("[labels]\n\"site\" = \"lab\"\n"), "{text}");
    }

    #[test]
    fn labels_are_checked() {
        assert!(parse_labels(&["nokey".into()]).is_err());
        assert!(parse_labels(&["bad key=x".into()]).is_err());
        assert_eq!(
            parse_labels(&["a=b".into()]).unwrap(),
            vec![("a".into(), "b".into())]
        );
    }
}
