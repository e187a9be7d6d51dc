//! The randomized fault run of issue 26, in the spirit of Jepsen and of
//! FoundationDB's simulation: the whole stack as real processes (the API
//! server, two server replicas sharing the robots' topics, two managers
//! with leader election, Mosquitto, four or more agents), a workload of
//! every Job shape the project has, and a nemesis that picks faults at
//! random from a seed. A checker then reads what the tasks themselves
//! recorded and what the cluster says.
//!
//! - **History**: every attempt appends `start`, `mark` (every 200 ms) and
//!   `end` lines (task uid, attempt, robot, pid, time) to one file; the
//!   tasks' own clock is the machine's, never a robot's faked one.
//! - **Observer**: an MQTT client records every status a robot sends and
//!   every confirmation the server gives, so "acknowledged" means what the
//!   robot was told.
//! - **Checks**: no two attempts of one Task overlap in time; no
//!   acknowledged terminal status of a Task's current attempt is missing
//!   from the Task; no two runs of the PeriodicJob (`Forbid`) run at once; no
//!   task process is left once every Job is deleted; every Job is terminal
//!   (or running, for services) within the recovery time after the last
//!   fault.
//!
//! The seed decides the workload and the faults (what, where, when and
//! how long); the machine's timing does the rest, so a failing seed replays
//! the same story, not the same interleaving.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s4r_api::backoff::Jitter;
use k8s4r_api::names::{ANNOTATION_CANCEL, ANNOTATION_RETRY};
use k8s4r_api::protocol::{decode, StatusAck, StatusUpdate};
use k8s4r_api::{Job, PeriodicJob, Task, TaskState, WorkState};
use k8s4r_testbed::{eventually, Fault, Mosquitto, Program, Proxy};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::faults::{api_addr, kubeconfig_through, start_api, start_manager, start_server, Binaries, NS};

/// The longest a SIGSTOP holds a program, in seconds.
const LONGEST_FREEZE_S: f64 = 6.0;
/// The managers' `--robot-lost-grace`: longer than the longest freeze, with
/// room for the agent to notice once it runs again. An agent frozen during
/// its attempt's stop window cannot stop it until it runs again, so the
/// grace is what bounds the freeze fencing survives (30 s by default); the
/// scenarios' 1 s, shorter than these freezes, let a replacement start
/// 86 ms before a frozen agent stopped the attempt it replaced.
const ROBOT_LOST_GRACE: &str = "10s";

/// What a run is told.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Decides the workload and the faults.
    pub seed: u64,
    /// How long the nemesis injects faults.
    pub length: Duration,
    /// Agents (at least four).
    pub robots: usize,
    /// How long after the last fault every Job must be settled.
    pub recovery: Duration,
    /// Mean time between two faults.
    pub mean_gap: Duration,
    /// Keep the run's directory (logs, history) for a look.
    pub keep: bool,
}

impl Settings {
    /// `length` of faults from `seed`, with the defaults for the rest.
    pub fn new(seed: u64, length: Duration) -> Self {
        Self {
            seed,
            length,
            robots: 4,
            recovery: Duration::from_secs(180),
            mean_gap: Duration::from_secs(6),
            keep: std::env::var_os("K8S4R_CHAOS_KEEP").is_some(),
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Faults injected, all kinds.
    pub faults: usize,
    /// Faults per kind.
    pub by_kind: BTreeMap<&'static str, usize>,
    /// Pairs of attempts of one Task that ran at the same time.
    pub overlaps: usize,
    /// Acknowledged terminal statuses the cluster does not show.
    pub lost_statuses: usize,
    /// Jobs neither terminal nor (services) running after the recovery.
    pub stuck_jobs: usize,
    /// Attempts of different runs of the PeriodicJob that ran at once despite `Forbid`.
    pub periodic_overlaps: usize,
    /// Task processes left once every Job was deleted.
    pub leftover_processes: usize,
    /// Minutes of faults.
    pub minutes: f64,
    /// Jobs submitted, attempts that ran, statuses acknowledged.
    pub jobs: usize,
    /// Attempts that left a history.
    pub attempts: usize,
    /// Terminal statuses the observer saw acknowledged.
    pub acknowledged: usize,
    /// Manual cancels and retries.
    pub manual: usize,
    /// What went wrong, for a person.
    pub problems: Vec<String>,
}

impl Outcome {
    /// Every check held.
    pub fn passed(&self) -> bool {
        self.overlaps == 0
            && self.lost_statuses == 0
            && self.stuck_jobs == 0
            && self.periodic_overlaps == 0
            && self.leftover_processes == 0
            && self.problems.is_empty()
    }

    /// The figures, as `BENCH` lines.
    pub fn bench_lines(&self) -> Vec<String> {
        vec![
            format!("BENCH chaos_faults_injected {} faults", self.faults),
            format!("BENCH chaos_overlaps {} pairs", self.overlaps),
            format!("BENCH chaos_lost_statuses {} statuses", self.lost_statuses),
            format!("BENCH chaos_stuck_jobs {} jobs", self.stuck_jobs),
            format!("BENCH chaos_minutes {:.1} min", self.minutes),
        ]
    }
}

/// A seeded source of decisions.
struct Dice(Jitter);

impl Dice {
    fn unit(&mut self) -> f64 {
        self.0.next_f64()
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n.saturating_sub(1))
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * self.unit())
    }
}

/// libfaketime, if installed: steps a robot's wall clock without changing
/// the agent's code paths.
fn faketime_library() -> Option<PathBuf> {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
    ];
    dirs.iter()
        .map(|d| Path::new(d).join("libfaketimeMT.so.1"))
        .find(|p| p.exists())
}

/// One robot: its agent, the link to the broker, its state directory (a
/// tmpfs of its own when the run may mount one, so its disk can fill).
struct Robot {
    name: String,
    agent: Program,
    link: Proxy,
    state: PathBuf,
    clock: Option<PathBuf>,
    tmpfs: bool,
}

impl Robot {
    fn filler(&self) -> PathBuf {
        self.state.join("filler")
    }
}

/// What writes an attempt's history: the file and the run's tag.
#[derive(Clone)]
struct Scripts {
    history: PathBuf,
    tag: String,
}

impl Scripts {
    /// The shell script of an attempt: records its start, marks itself
    /// every 200 ms for `seconds` (forever when None: a service), records
    /// its end; `fail_first` fails the first attempt with exit 1.
    fn script(&self, seconds: Option<f64>, fail_first: bool) -> String {
        let h = self.history.display();
        let id = "$K8S4R_TASK_UID $K8S4R_TASK_ATTEMPT $K8S4R_ROBOT_ID $$ $K8S4R_TASK_NAME";
        let until = match seconds {
            Some(s) => format!("end=$(( $(date +%s%N) + {} ))", (s * 1e9) as u64),
            None => "end=99999999999999999999".to_owned(),
        };
        let finish = if fail_first {
            format!("if [ \"$K8S4R_TASK_ATTEMPT\" = 1 ]; then echo \"end {id} $(date +%s%N) fail\" >> {h}; exit 1; fi; ")
        } else {
            String::new()
        };
        format!(
            "echo \"start {id} $(date +%s%N)\" >> {h}; \
             trap 'echo \"end {id} $(date +%s%N) stopped\" >> {h}; exit 143' TERM INT; {until}; \
             while [ $(date +%s%N) -lt $end ]; do echo \"mark {id} $(date +%s%N)\" >> {h}; sleep 0.2; done; \
             {finish}echo \"end {id} $(date +%s%N) done\" >> {h} # {}",
            self.tag
        )
    }
}

/// How long any one call of the checker or the workload to the API server
/// may take: the nemesis may have stopped it.
const CALL: Duration = Duration::from_secs(10);

/// `call`, or None after [`CALL`].
async fn bounded<T>(call: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(CALL, call).await.ok()
}

/// The cluster under test.
struct Cluster {
    dir: tempfile::TempDir,
    broker: Mosquitto,
    api: Program,
    api_link: Proxy,
    client: Client,
    servers: Vec<Program>,
    managers: Vec<Program>,
    robots: Vec<Robot>,
    history: PathBuf,
    tag: String,
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

impl Cluster {
    async fn start(bins: &Binaries, settings: &Settings) -> Cluster {
        k8s4r_mqtt::install_crypto_provider();
        let mut dir = tempfile::tempdir().expect("a scratch dir");
        if settings.keep {
            dir.disable_cleanup(true);
            eprintln!("chaos run in {}", dir.path().display());
        }
        let path = |p: &str| dir.path().join(p);
        let history_dir = path("history");
        std::fs::create_dir_all(&history_dir).expect("history dir");
        set_mode(&history_dir, 0o1777);
        let history = history_dir.join("history");
        std::fs::write(&history, b"").expect("history file");
        set_mode(&history, 0o666);
        let broker = Mosquitto::start_with(|port, d| {
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n\
                 autosave_interval 1\nmax_queued_messages 10000\nset_tcp_nodelay true\nmax_packet_size {}\n",
                d.display(),
                k8s4r_api::protocol::MAX_PACKET_BYTES
            )
        });
        let (api, client, kubeconfig) = start_api(&bins.apiserver, dir.path()).await;
        k8s4r::up::install_crds(&client).await.expect("CRDs installed");
        k8s4r::up::apply_cluster_rbac(&client)
            .await
            .expect("namespaces and RBAC");
        // The programs reach the API server through a link the nemesis
        // slows down; the checker reads it directly.
        let api_link = Proxy::start(api_addr(&kubeconfig)).await;
        let linked = path("kubeconfig-linked");
        kubeconfig_through(&kubeconfig, &api_link, &linked);
        let kc = linked.display().to_string();
        let servers = (1..=2)
            .map(|i| {
                let id = format!("s{i}");
                let extra = ["--shared-group", "chaos", "--leader-election", "--identity", &id];
                let log = path(&format!("server-{id}.log"));
                start_server(
                    &bins.server,
                    &kc,
                    &broker.url(),
                    &extra,
                    &log,
                    &format!("server-{id}"),
                )
            })
            .collect();
        let managers = (1..=2)
            .map(|i| {
                let id = format!("m{i}");
                let log = path(&format!("manager-{id}.log"));
                start_manager(
                    &bins.manager,
                    &kc,
                    &["--identity", &id, "--robot-lost-grace", ROBOT_LOST_GRACE],
                    &log,
                    &format!("manager-{id}"),
                )
            })
            .collect();
        let mut cluster = Cluster {
            tag: format!("k8s4r-chaos-{}-{}", settings.seed, std::process::id()),
            dir,
            broker,
            api,
            api_link,
            client,
            servers,
            managers,
            robots: Vec::new(),
            history,
        };
        for i in 1..=settings.robots.max(4) {
            cluster.add_robot(bins, &format!("c{i}")).await;
        }
        let robots: Api<k8s4r_api::Robot> = Api::all(cluster.client.clone());
        for robot in cluster.robots.iter().map(|r| r.name.clone()).collect::<Vec<_>>() {
            eventually(
                Duration::from_secs(120),
                &format!("robot {robot} Online"),
                || async {
                    let r = robots.get_opt(&robot).await.ok()??;
                    (r.status?.phase? == k8s4r_api::RobotPhase::Online).then_some(())
                },
            )
            .await;
        }
        cluster
    }

    async fn add_robot(&mut self, bins: &Binaries, name: &str) {
        let upstream = format!("127.0.0.1:{}", self.broker.port).parse().expect("addr");
        let link = Proxy::start(upstream).await;
        let state = self.dir.path().join("robots").join(name);
        std::fs::create_dir_all(&state).expect("state dir");
        // A disk of its own (root only): 64 MiB of tmpfs that a fault fills.
        let tmpfs = nix::unistd::geteuid().is_root()
            && std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs"])
                .arg(&state)
                .status()
                .is_ok_and(|s| s.success());
        let mut env = Vec::new();
        let clock = faketime_library().map(|library| {
            let clock = self.dir.path().join(format!("{name}.clock"));
            std::fs::write(&clock, "+0\n").expect("clock file");
            env.push(("LD_PRELOAD".to_owned(), library.display().to_string()));
            env.push(("FAKETIME_TIMESTAMP_FILE".to_owned(), clock.display().to_string()));
            env.push(("FAKETIME_CACHE_DURATION".to_owned(), "1".to_owned()));
            // Only the wall clock steps: fencing counts on CLOCK_BOOTTIME.
            env.push(("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()));
            clock
        });
        let agent = Program::start_with_env(
            name,
            &bins.agent,
            args(&[
                "--robot-id",
                name,
                "--broker-url",
                &link.mqtt_url(),
                "--state-dir",
                &state.display().to_string(),
                "--keep-alive",
                "2s",
                "--label",
                "fleet=chaos",
                "--log",
                "info",
            ]),
            env,
            &self.dir.path().join(format!("{name}.log")),
        );
        self.robots.push(Robot {
            name: name.to_owned(),
            agent,
            link,
            state,
            clock,
            tmpfs,
        });
    }

    fn scripts(&self) -> Scripts {
        Scripts {
            history: self.history.clone(),
            tag: self.tag.clone(),
        }
    }

    /// The server replica, manager or other program `name`.
    fn program(&mut self, which: &Target) -> Option<&mut Program> {
        match which {
            Target::Server(i) => self.servers.get_mut(*i),
            Target::Manager(i) => self.managers.get_mut(*i),
            Target::Agent(i) => self.robots.get_mut(*i).map(|r| &mut r.agent),
            Target::Api => Some(&mut self.api),
            _ => None,
        }
    }

    /// What systemd does for a robot's agent that died: the unit's
    /// `ExecStopPost` (`--stop-left-tasks`) before the next start.
    fn stop_left_tasks(&self, robot: usize) {
        let Some(r) = self.robots.get(robot) else { return };
        let (program, args) = r.agent.command();
        let Ok(mut child) = std::process::Command::new(program)
            .args(args)
            .arg("--stop-left-tasks")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        else {
            return;
        };
        let give_up = Instant::now() + CALL;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Restarts whatever exited on its own (systemd's `Restart=always`,
    /// Kubernetes' restart of a crashed pod).
    fn supervise(&mut self) -> usize {
        let mut restarted = 0;
        for i in 0..self.robots.len() {
            if self.robots[i].agent.exited() {
                self.stop_left_tasks(i);
                self.robots[i].agent.restart();
                restarted += 1;
            }
        }
        for p in self.servers.iter_mut().chain(self.managers.iter_mut()) {
            if p.exited() {
                p.restart();
                restarted += 1;
            }
        }
        restarted
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for robot in &mut self.robots {
            robot.agent.kill();
            if robot.tmpfs {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&robot.state)
                    .status();
            }
        }
        // Whatever the agents left (a failed run) goes too.
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-f", &self.tag])
            .status();
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

// ---------------------------------------------------------------- the nemesis

/// What a fault acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Target {
    Server(usize),
    Manager(usize),
    Agent(usize),
    Link(usize),
    Clock(usize),
    Disk(usize),
    Broker,
    Api,
    ApiLink,
}

/// The end of a fault.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Heal {
    /// Start a killed program again.
    Start(Target),
    /// SIGCONT a stopped program.
    Continue(Target),
    /// Heal a robot's link.
    Link(usize),
    /// Heal the API server's link.
    ApiLink,
    /// Put a robot's wall clock right.
    Clock(usize),
    /// Free a robot's disk.
    Disk(usize),
}

impl Heal {
    fn target(&self) -> Target {
        match self {
            Heal::Start(t) | Heal::Continue(t) => t.clone(),
            Heal::Link(i) => Target::Link(*i),
            Heal::ApiLink => Target::ApiLink,
            Heal::Clock(i) => Target::Clock(*i),
            Heal::Disk(i) => Target::Disk(*i),
        }
    }
}

struct Nemesis {
    dice: Dice,
    heals: BinaryHeap<Reverse<(Instant, u64, Heal)>>,
    busy: HashMap<Target, Instant>,
    counter: u64,
    by_kind: BTreeMap<&'static str, usize>,
    log: Vec<String>,
    started: Instant,
}

impl Nemesis {
    fn free(&self, target: &Target) -> bool {
        !self.busy.contains_key(target)
    }

    fn later(&mut self, after: Duration, heal: Heal) {
        self.counter += 1;
        let at = Instant::now() + after;
        self.busy.insert(heal.target(), at);
        self.heals.push(Reverse((at, self.counter, heal)));
    }

    fn note(&mut self, kind: &'static str, what: String) {
        *self.by_kind.entry(kind).or_default() += 1;
        self.log.push(format!(
            "{:7.1}s {kind}: {what}",
            self.started.elapsed().as_secs_f64()
        ));
    }

    /// Injects one fault at random, if its target is free.
    fn strike(&mut self, cluster: &mut Cluster) -> bool {
        let robots = cluster.robots.len();
        let r = self.dice.below(robots);
        match self.dice.below(10) {
            0 | 1 if self.free(&Target::Link(r)) => {
                let cut = self.dice.chance(0.4);
                let hold = if cut {
                    self.dice.secs(2.0, 20.0)
                } else {
                    self.dice.secs(3.0, 40.0)
                };
                cluster.robots[r]
                    .link
                    .set(if cut { Fault::Cut } else { Fault::Blackhole });
                self.later(hold, Heal::Link(r));
                let kind = if cut { "cut_link" } else { "blackhole_link" };
                let name = cluster.robots[r].name.clone();
                self.note(kind, format!("{name} for {hold:.1?}"));
            }
            2 => {
                let target = match self.dice.below(4) {
                    0 => Target::Server(self.dice.below(2)),
                    1 => Target::Manager(self.dice.below(2)),
                    2 => Target::Agent(r),
                    _ => Target::Broker,
                };
                if !self.free(&target) {
                    return false;
                }
                let down = self.dice.secs(0.5, 5.0);
                match &target {
                    Target::Broker => cluster.broker.kill(),
                    Target::Agent(i) => {
                        cluster.robots[*i].agent.kill();
                        cluster.stop_left_tasks(*i);
                    }
                    other => {
                        if let Some(p) = cluster.program(other) {
                            p.kill();
                        }
                    }
                }
                self.later(down, Heal::Start(target.clone()));
                self.note("sigkill", format!("{target:?}, down {down:.1?}"));
            }
            3 => {
                let target = match self.dice.below(5) {
                    0 => Target::Server(self.dice.below(2)),
                    1 => Target::Manager(self.dice.below(2)),
                    2 | 3 => Target::Agent(r),
                    _ => Target::Api,
                };
                if !self.free(&target) {
                    return false;
                }
                let pid = cluster.program(&target).and_then(|p| p.pid());
                let Some(pid) = pid else { return false };
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGSTOP,
                );
                let hold = self.dice.secs(1.0, LONGEST_FREEZE_S);
                self.later(hold, Heal::Continue(target.clone()));
                self.note("sigstop", format!("{target:?} for {hold:.1?}"));
            }
            4 if self.free(&Target::ApiLink) => {
                let delay = self.dice.secs(0.2, 1.5);
                let hold = self.dice.secs(5.0, 30.0);
                cluster.api_link.set(Fault::Delay(delay));
                self.later(hold, Heal::ApiLink);
                self.note("delay_api", format!("{delay:.1?} for {hold:.1?}"));
            }
            5 if self.free(&Target::Clock(r)) && cluster.robots[r].clock.is_some() => {
                let step =
                    (60.0 + self.dice.unit() * 7140.0) as i64 * if self.dice.chance(0.5) { 1 } else { -1 };
                let hold = self.dice.secs(10.0, 60.0);
                if let Some(clock) = &cluster.robots[r].clock {
                    let _ = std::fs::write(clock, format!("{step:+}\n"));
                }
                self.later(hold, Heal::Clock(r));
                let name = cluster.robots[r].name.clone();
                self.note("step_clock", format!("{name} by {step:+} s for {hold:.1?}"));
            }
            6 if self.free(&Target::Disk(r)) && cluster.robots[r].tmpfs => {
                fill(&cluster.robots[r].filler());
                let hold = self.dice.secs(10.0, 40.0);
                self.later(hold, Heal::Disk(r));
                let name = cluster.robots[r].name.clone();
                self.note("fill_disk", format!("{name} for {hold:.1?}"));
            }
            7 if self.free(&Target::Agent(r)) => {
                cluster.robots[r].agent.kill();
                cluster.stop_left_tasks(r);
                let down = self.dice.secs(1.0, 5.0);
                self.later(down, Heal::Start(Target::Agent(r)));
                let name = cluster.robots[r].name.clone();
                self.note("sigkill", format!("agent {name}, down {down:.1?}"));
            }
            8 if self.free(&Target::Link(r)) => {
                cluster.robots[r].link.set(Fault::Blackhole);
                let hold = self.dice.secs(3.0, 40.0);
                self.later(hold, Heal::Link(r));
                let name = cluster.robots[r].name.clone();
                self.note("blackhole_link", format!("{name} for {hold:.1?}"));
            }
            9 => {
                let target = Target::Server(self.dice.below(2));
                if !self.free(&target) {
                    return false;
                }
                if let Some(p) = cluster.program(&target) {
                    p.kill();
                }
                let down = self.dice.secs(0.5, 5.0);
                self.later(down, Heal::Start(target.clone()));
                self.note("sigkill", format!("{target:?}, down {down:.1?}"));
            }
            _ => return false,
        }
        true
    }

    /// Ends every fault due by now (all of them with `all`).
    fn heal(&mut self, cluster: &mut Cluster, all: bool) {
        let now = Instant::now();
        while let Some(Reverse((at, _, _))) = self.heals.peek() {
            if !all && *at > now {
                break;
            }
            let Some(Reverse((_, _, heal))) = self.heals.pop() else {
                break;
            };
            self.busy.remove(&heal.target());
            match heal {
                Heal::Start(Target::Broker) => cluster.broker.resume(),
                Heal::Start(target) => {
                    if let Some(p) = cluster.program(&target) {
                        p.resume();
                    }
                }
                Heal::Continue(target) => {
                    if let Some(pid) = cluster.program(&target).and_then(|p| p.pid()) {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGCONT,
                        );
                    }
                }
                Heal::Link(i) => cluster.robots[i].link.heal(),
                Heal::ApiLink => cluster.api_link.heal(),
                Heal::Clock(i) => {
                    if let Some(clock) = &cluster.robots[i].clock {
                        let _ = std::fs::write(clock, "+0\n");
                    }
                }
                Heal::Disk(i) => {
                    let _ = std::fs::remove_file(cluster.robots[i].filler());
                }
            }
        }
    }
}

/// Writes zeros to `path` until the file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let Ok(mut file) = std::fs::File::create(path) else {
        return;
    };
    let block = vec![0u8; 1 << 20];
    while file.write_all(&block).is_ok() {}
    let _ = file.sync_all();
}

// ---------------------------------------------------------------- the workload

/// The Job shapes of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A batch group with retries; some first attempts fail.
    Batch,
    /// Groups ordered by `after:`.
    Ordered,
    /// One task per robot, `maxParallel` 2.
    EveryRobot,
    /// A service (restarted on the robot when it exits).
    Service,
}

struct Workload {
    client: Client,
    scripts: Scripts,
    dice: Dice,
    jobs: Vec<(String, Shape)>,
    manual: usize,
    log: Vec<String>,
}

impl Workload {
    fn task(&mut self, seconds: Option<f64>, fail_first: bool) -> serde_json::Value {
        let mut task = serde_json::json!({
            "driver": "exec",
            "command": "/bin/sh",
            "args": ["-c", self.scripts.script(seconds, fail_first)],
            "timeout": "5m",
            "killTimeout": "1s",
        });
        if seconds.is_none() {
            task["kind"] = "service".into();
            task["restart"] =
                serde_json::json!({ "attempts": 3, "interval": "10m", "delay": "1s", "mode": "delay" });
        }
        task
    }

    fn disconnect(&mut self) -> serde_json::Value {
        // Mostly replaceable; some wait for their robot whatever happens.
        if self.dice.chance(0.8) {
            serde_json::json!({ "stopAfter": "10s", "replace": true })
        } else {
            serde_json::json!({ "stopAfter": "10s", "replace": false })
        }
    }

    fn group(&mut self, name: &str, count: usize, after: &[&str]) -> serde_json::Value {
        let seconds = 4.0 + self.dice.unit() * 16.0;
        let fail_first = self.dice.chance(0.3);
        let task = self.task(Some(seconds), fail_first);
        let disconnect = self.disconnect();
        let mut group = serde_json::json!({
            "name": name,
            "count": count,
            "disconnect": disconnect,
            "task": task,
            "restartPolicy": { "attempts": 3, "delay": "2s" },
        });
        if !after.is_empty() {
            group["after"] = serde_json::json!(after);
        }
        group
    }

    async fn submit(&mut self) {
        let n = self.jobs.len();
        let shape = match self.dice.below(10) {
            0..=3 => Shape::Batch,
            4 | 5 => Shape::Ordered,
            6 | 7 => Shape::EveryRobot,
            _ => Shape::Service,
        };
        let name = format!("chaos-{n}");
        let groups = match shape {
            Shape::Batch => {
                let count = 1 + self.dice.below(4);
                vec![self.group("g", count, &[])]
            }
            Shape::Ordered => vec![self.group("first", 1, &[]), self.group("then", 2, &["first"])],
            Shape::EveryRobot => {
                let mut group = self.group("g", 1, &[]);
                if let Some(g) = group.as_object_mut() {
                    g.remove("count");
                }
                group["mode"] = "everyRobot".into();
                group["maxParallel"] = 2.into();
                group["maxFailed"] = "50%".into();
                vec![group]
            }
            Shape::Service => {
                let task = self.task(None, false);
                let disconnect = self.disconnect();
                vec![serde_json::json!({
                    "name": "svc",
                    "count": 1,
                    "disconnect": disconnect,
                    "task": task,
                })]
            }
        };
        let job: Job = match serde_json::from_value(serde_json::json!({
            "apiVersion": "robot.k8s4r.io/v1alpha1",
            "kind": "Job",
            "metadata": { "name": name, "namespace": NS },
            "spec": { "robotSelector": { "matchLabels": { "fleet": "chaos" } }, "taskGroups": groups }
        })) {
            Ok(job) => job,
            Err(e) => panic!("a chaos Job of shape {shape:?}: {e}"),
        };
        match bounded(Api::<Job>::namespaced(self.client.clone(), NS).create(&PostParams::default(), &job))
            .await
        {
            Some(Ok(_)) => {
                self.log.push(format!("job {name}: {shape:?}"));
                self.jobs.push((name, shape));
            }
            Some(Err(e)) => self.log.push(format!("job {name} not created: {e}")),
            None => self
                .log
                .push(format!("job {name}: no answer (the API server may be stopped)")),
        }
    }

    /// A person's cancel of a running Task, or retry of a finished one.
    async fn act(&mut self) {
        let api: Api<Task> = Api::namespaced(self.client.clone(), NS);
        let Some(Ok(tasks)) = bounded(api.list(&ListParams::default())).await else {
            return;
        };
        let tasks: Vec<Task> = tasks.items;
        if tasks.is_empty() {
            return;
        }
        let task = &tasks[self.dice.below(tasks.len())];
        let state = task.status.as_ref().and_then(|s| s.state);
        let annotation = match state {
            Some(TaskState::Running | TaskState::Dispatching) => ANNOTATION_CANCEL,
            Some(TaskState::Failed | TaskState::Cancelled) => ANNOTATION_RETRY,
            _ => return,
        };
        let patch = serde_json::json!({ "metadata": { "annotations": {
            annotation: jiff::Timestamp::now().to_string(),
        }}});
        let patched =
            bounded(api.patch(&task.name_any(), &PatchParams::default(), &Patch::Merge(&patch))).await;
        if matches!(patched, Some(Ok(_))) {
            self.manual += 1;
            self.log.push(format!(
                "{} {}",
                if annotation == ANNOTATION_CANCEL {
                    "cancel"
                } else {
                    "retry"
                },
                task.name_any()
            ));
        }
    }
}

/// Submits Jobs and acts as a person until `stop`; gives the workload back.
async fn drive(mut workload: Workload, stop: std::sync::Arc<tokio::sync::Notify>) -> Workload {
    let stopped = stop.notified();
    tokio::pin!(stopped);
    let mut next_job = tokio::time::Instant::now();
    let mut next_act = next_job + Duration::from_secs(20);
    loop {
        tokio::select! {
            _ = &mut stopped => return workload,
            _ = tokio::time::sleep_until(next_job.min(next_act)) => {}
        }
        let now = tokio::time::Instant::now();
        if now >= next_job {
            workload.submit().await;
            next_job = tokio::time::Instant::now() + workload.dice.secs(6.0, 18.0);
        }
        if now >= next_act {
            workload.act().await;
            next_act = tokio::time::Instant::now() + workload.dice.secs(10.0, 40.0);
        }
    }
}

/// The PeriodicJob with `Forbid`: every minute a run longer than a minute.
async fn create_periodic(cluster: &Cluster) {
    let periodic: PeriodicJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1",
        "kind": "PeriodicJob",
        "metadata": { "name": "chaos-periodic", "namespace": NS },
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 100,
            "failedJobsHistoryLimit": 100,
            "jobTemplate": { "spec": {
                "robotSelector": { "matchLabels": { "fleet": "chaos" } },
                "taskGroups": [{
                    "name": "g",
                    "count": 1,
                    "disconnect": { "stopAfter": "10s", "replace": true },
                    "task": {
                        "driver": "exec",
                        "command": "/bin/sh",
                        "args": ["-c", cluster.scripts().script(Some(75.0), false)],
                        "timeout": "5m",
                        "killTimeout": "1s",
                    },
                    "restartPolicy": { "attempts": 3, "delay": "2s" },
                }]
            }}
        }
    }))
    .expect("a PeriodicJob");
    Api::<PeriodicJob>::namespaced(cluster.client.clone(), NS)
        .create(&PostParams::default(), &periodic)
        .await
        .expect("the PeriodicJob is created");
}

// ---------------------------------------------------------------- the observer

/// Every status a robot sent and every confirmation it got.
#[derive(Debug, Default)]
struct Observed {
    /// (robot, seq) → the status.
    statuses: HashMap<(String, u64), StatusUpdate>,
    /// (robot, seq) the server confirmed.
    confirmed: BTreeSet<(String, u64)>,
}

async fn observe(port: u16, stop: std::sync::Arc<tokio::sync::Notify>) -> Observed {
    let mut options = rumqttc::MqttOptions::new("chaos-observer", "127.0.0.1", port);
    options.set_clean_session(false);
    options.set_max_packet_size(4 << 20, 4 << 20);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = rumqttc::AsyncClient::new(options, 1000);
    let mut seen = Observed::default();
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        let event = tokio::select! {
            _ = &mut stopped => break,
            event = events.poll() => event,
        };
        match event {
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                for filter in ["k8s4r/robots/+/tasks/+/status", "k8s4r/robots/+/tasks/acks"] {
                    let _ = client.try_subscribe(filter, rumqttc::QoS::AtLeastOnce);
                }
            }
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                let robot = p.topic.split('/').nth(2).unwrap_or_default().to_owned();
                if p.topic.ends_with("/status") {
                    if let Ok(update) = decode::<StatusUpdate>(&p.payload) {
                        seen.statuses.insert((robot, update.seq), update);
                    }
                } else if let Ok(ack) = decode::<StatusAck>(&p.payload) {
                    for seq in ack.seqs {
                        seen.confirmed.insert((robot.clone(), seq));
                    }
                }
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    seen
}

// ---------------------------------------------------------------- the history

/// One attempt as its own lines tell it.
#[derive(Debug, Clone, Default)]
struct Span {
    first: u128,
    last: u128,
    name: String,
}

/// (uid, attempt) → when it ran.
fn read_history(path: &Path) -> BTreeMap<(String, u32), Span> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut spans: BTreeMap<(String, u32), Span> = BTreeMap::new();
    for line in text.lines() {
        // kind uid attempt robot pid name time [how]
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 7 {
            continue;
        }
        let (Ok(attempt), Ok(at)) = (fields[2].parse::<u32>(), fields[6].parse::<u128>()) else {
            continue;
        };
        let span = spans.entry((fields[1].to_owned(), attempt)).or_insert(Span {
            first: at,
            last: at,
            name: fields[5].to_owned(),
        });
        span.first = span.first.min(at);
        span.last = span.last.max(at);
    }
    spans
}

/// Pairs of overlapping attempts of one Task.
fn overlaps(spans: &BTreeMap<(String, u32), Span>) -> Vec<String> {
    let mut by_uid: BTreeMap<&str, Vec<(u32, &Span)>> = BTreeMap::new();
    for ((uid, attempt), span) in spans {
        by_uid.entry(uid).or_default().push((*attempt, span));
    }
    let mut found = Vec::new();
    for (uid, attempts) in by_uid {
        for (i, (a, sa)) in attempts.iter().enumerate() {
            for (b, sb) in &attempts[i + 1..] {
                if sa.first <= sb.last && sb.first <= sa.last {
                    found.push(format!("{} ({uid}): attempts {a} and {b}", sa.name));
                }
            }
        }
    }
    found
}

/// Attempts of different runs of the PeriodicJob (`Forbid`) that ran at
/// the same time (its Jobs are `chaos-periodic-*`; a Task's name is
/// `<job>-g-<index>`). Attempts, not a run's whole span: a run retried
/// after a later one ended is no overlap.
fn periodic_overlaps(spans: &BTreeMap<(String, u32), Span>) -> Vec<String> {
    let mut attempts: Vec<(String, u32, &Span)> = Vec::new();
    for ((_, attempt), span) in spans {
        let Some(task) = span.name.strip_prefix(&format!("{NS}/")) else {
            continue;
        };
        if !task.starts_with("chaos-periodic-") {
            continue;
        }
        let job = task.rsplitn(3, '-').nth(2).unwrap_or(task).to_owned();
        attempts.push((job, *attempt, span));
    }
    let mut found = Vec::new();
    for (i, (job_a, a, sa)) in attempts.iter().enumerate() {
        for (job_b, b, sb) in &attempts[i + 1..] {
            if job_a != job_b && sa.first <= sb.last && sb.first <= sa.last {
                found.push(format!("{job_a} attempt {a} and {job_b} attempt {b}"));
            }
        }
    }
    found
}

/// Acknowledged terminal statuses of a Task's current attempt that the
/// Task does not show.
fn lost_statuses(observed: &Observed, tasks: &[Task]) -> (usize, Vec<String>) {
    let by_uid: HashMap<String, &Task> = tasks
        .iter()
        .filter_map(|t| Some((t.metadata.uid.clone()?, t)))
        .collect();
    let mut acknowledged = 0;
    let mut lost = Vec::new();
    for (key, update) in &observed.statuses {
        if !update.state.is_terminal() || !observed.confirmed.contains(key) {
            continue;
        }
        acknowledged += 1;
        let Some(task) = by_uid.get(&update.task_uid) else {
            continue;
        };
        let status = task.status.clone().unwrap_or_default();
        if status.attempt != update.attempt {
            continue;
        }
        let shown = status.state.is_some_and(|s| s.is_terminal());
        if !shown {
            lost.push(format!(
                "{} attempt {}: robot {} was told its {} status (seq {}) was applied; the Task shows {:?}",
                task.name_any(),
                update.attempt,
                key.0,
                update.state.as_str(),
                key.1,
                status.state
            ));
        }
    }
    (acknowledged, lost)
}

// ---------------------------------------------------------------- the run

/// Whether `job` has settled: terminal, or a service running.
fn settled(job: &Job, services: &BTreeSet<String>) -> bool {
    let state = job.status.as_ref().and_then(|s| s.state);
    match state {
        Some(WorkState::Completed | WorkState::Failed | WorkState::Cancelled | WorkState::Skipped) => true,
        Some(WorkState::Running) => services.contains(&job.name_any()),
        _ => false,
    }
}

/// One run: starts the cluster, runs the workload under the nemesis for
/// `settings.length`, lets it recover, checks, and cleans up.
pub async fn run(bins: &Binaries, settings: Settings) -> Outcome {
    eprintln!("chaos: seed {} for {:?}", settings.seed, settings.length);
    let mut cluster = Cluster::start(bins, &settings).await;
    let stop_observing = std::sync::Arc::new(tokio::sync::Notify::new());
    let observer = tokio::spawn(observe(cluster.broker.port, stop_observing.clone()));
    create_periodic(&cluster).await;
    let mut nemesis = Nemesis {
        dice: Dice(Jitter::with_seed(settings.seed)),
        heals: BinaryHeap::new(),
        busy: HashMap::new(),
        counter: 0,
        by_kind: BTreeMap::new(),
        log: Vec::new(),
        started: Instant::now(),
    };
    let workload = Workload {
        client: cluster.client.clone(),
        scripts: cluster.scripts(),
        dice: Dice(Jitter::with_seed(settings.seed ^ 0x5eed)),
        jobs: Vec::new(),
        manual: 0,
        log: Vec::new(),
    };
    // The workload runs on its own: a call it makes to an API server the
    // nemesis stopped must never hold up the nemesis (which continues it).
    let stop_workload = std::sync::Arc::new(tokio::sync::Notify::new());
    let workload = tokio::spawn(drive(workload, stop_workload.clone()));
    let started = Instant::now();
    let mut next_fault = started + Duration::from_secs(5);
    let mut faults = 0;
    let gap = settings.mean_gap.as_secs_f64();
    while started.elapsed() < settings.length {
        let now = Instant::now();
        nemesis.heal(&mut cluster, false);
        cluster.supervise();
        if now >= next_fault {
            if nemesis.strike(&mut cluster) {
                faults += 1;
            }
            next_fault = now + nemesis.dice.secs(gap * 0.3, gap * 1.7);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_workload.notify_one();
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    // The last fault ends: everything heals, every program runs again.
    nemesis.heal(&mut cluster, true);
    cluster.broker.resume();
    cluster.api.resume();
    for p in cluster.servers.iter_mut().chain(cluster.managers.iter_mut()) {
        p.resume();
    }
    for r in &mut cluster.robots {
        r.agent.resume();
    }
    let last_fault = Instant::now();
    eprintln!("chaos: {faults} faults in {minutes:.1} min; recovering");
    let workload = match workload.await {
        Ok(workload) => workload,
        Err(e) => panic!("the workload task failed: {e}"),
    };

    let services: BTreeSet<String> = workload
        .jobs
        .iter()
        .filter(|(_, shape)| *shape == Shape::Service)
        .map(|(name, _)| name.clone())
        .collect();
    let jobs_api: Api<Job> = Api::namespaced(cluster.client.clone(), NS);
    // Runs of the PeriodicJob keep coming: it is suspended so that the
    // runs it has settle.
    let suspend = serde_json::json!({ "spec": { "suspend": true } });
    let _ = bounded(Api::<PeriodicJob>::namespaced(cluster.client.clone(), NS).patch(
        "chaos-periodic",
        &PatchParams::default(),
        &Patch::Merge(suspend),
    ))
    .await;
    let mut unsettled: Vec<String> = vec!["(the Jobs could not be listed)".to_owned()];
    while last_fault.elapsed() < settings.recovery {
        cluster.supervise();
        if let Some(Ok(jobs)) = bounded(jobs_api.list(&ListParams::default())).await {
            unsettled = jobs
                .items
                .iter()
                .filter(|j| !settled(j, &services))
                .map(|j| format!("{} ({:?})", j.name_any(), j.status.as_ref().and_then(|s| s.state)))
                .collect();
            if unsettled.is_empty() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let recovered_in = last_fault.elapsed();
    let tasks = bounded(Api::<Task>::namespaced(cluster.client.clone(), NS).list(&ListParams::default()))
        .await
        .and_then(Result::ok)
        .map(|l| l.items)
        .unwrap_or_default();
    // Every Job goes: nothing may be left running anywhere.
    let periodic = Api::<PeriodicJob>::namespaced(cluster.client.clone(), NS);
    let _ = bounded(periodic.delete("chaos-periodic", &DeleteParams::default())).await;
    let _ = bounded(jobs_api.delete_collection(&DeleteParams::default(), &ListParams::default())).await;
    let tag = cluster.tag.clone();
    let gone_by = Instant::now() + Duration::from_secs(120);
    let mut leftovers = processes_with(&tag);
    while !leftovers.is_empty() && Instant::now() < gone_by {
        cluster.supervise();
        tokio::time::sleep(Duration::from_millis(500)).await;
        leftovers = processes_with(&tag);
    }

    // The observer has seen the last confirmations by now.
    stop_observing.notify_one();
    let observed = observer.await.unwrap_or_default();
    let spans = read_history(&cluster.history);
    let overlapping = overlaps(&spans);
    let periodic = periodic_overlaps(&spans);
    let (acknowledged, lost) = lost_statuses(&observed, &tasks);
    let mut outcome = Outcome {
        seed: settings.seed,
        faults,
        by_kind: nemesis.by_kind.clone(),
        overlaps: overlapping.len(),
        lost_statuses: lost.len(),
        stuck_jobs: unsettled.len(),
        periodic_overlaps: periodic.len(),
        leftover_processes: leftovers.len(),
        minutes,
        jobs: workload.jobs.len(),
        attempts: spans.len(),
        acknowledged,
        manual: workload.manual,
        problems: Vec::new(),
    };
    outcome
        .problems
        .extend(overlapping.into_iter().map(|o| format!("overlap: {o}")));
    outcome
        .problems
        .extend(lost.into_iter().map(|l| format!("lost: {l}")));
    outcome.problems.extend(
        unsettled
            .iter()
            .map(|j| format!("stuck {recovered_in:.0?} after the last fault: {j}")),
    );
    outcome.problems.extend(
        periodic
            .into_iter()
            .map(|p| format!("periodic runs overlap: {p}")),
    );
    outcome
        .problems
        .extend(leftovers.iter().map(|p| format!("left running: {p}")));
    outcome.problems.extend(
        lost_exits(&cluster)
            .into_iter()
            .map(|l| format!("an exit status the agent could not read: {l}")),
    );
    if spans.is_empty() {
        outcome.problems.push("no attempt ran at all".into());
    }
    if !outcome.passed() || settings.keep {
        let report = cluster.dir.path().join("chaos-report.txt");
        let mut text = nemesis.log.join("\n");
        text.push_str("\n\n");
        text.push_str(&workload.log.join("\n"));
        let _ = std::fs::write(&report, text);
        eprintln!("chaos: the faults and the workload are in {}", report.display());
        if !outcome.passed() {
            cluster.dir.disable_cleanup(true);
            eprintln!(
                "chaos: the run's directory is kept: {}",
                cluster.dir.path().display()
            );
        }
    }
    outcome
}

/// The agents' log lines about a task process of their own whose exit
/// status they could not read (a process re-adopted after an agent
/// restart is not a child, and its status is unknown by design). Each is a
/// task that ended as failed whatever it did.
fn lost_exits(cluster: &Cluster) -> Vec<String> {
    cluster
        .robots
        .iter()
        .flat_map(|r| {
            let log = cluster.dir.path().join(format!("{}.log", r.name));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines()
                .filter(|l| l.contains("cannot wait for the task's process") && !l.contains("re-adopted"))
                .map(|l| format!("{}: {l}", r.name))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Processes whose command line names `tag`.
fn processes_with(tag: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id().to_string();
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| e.file_name().to_string_lossy() != me)
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (text.contains(tag) && !text.starts_with("pkill")).then(|| {
                format!(
                    "{} {}",
                    e.file_name().to_string_lossy(),
                    text.chars().take(80).collect::<String>()
                )
            })
        })
        .collect()
}

/// A seed from the clock and the process id, for a run told none.
pub fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// The 1-minute load average, for the record.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
