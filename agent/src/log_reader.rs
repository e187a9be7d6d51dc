//! Serves a task's output to the cluster on request (`logs/request`): what
//! its log files hold (rotated files included, oldest first), then, when
//! following, what it writes, until the server stops the reader or stops
//! renewing it ([`LOG_FOLLOW_LEASE`]). Nothing is sent while nobody asks.
//!
//! Chunks go out at QoS 0 on `tasks/{uid}/log`, numbered so that a lost one
//! shows as a gap, at most [`MAX_LOG_CHUNK_BYTES`] each. What is on disk
//! is sent whole, as fast as the server acknowledges it when it asks with a
//! window (its renewals carry how far it has delivered), else at most
//! [`RATE_BYTES_PER_S`] a second. Live output is sent at most
//! [`RATE_BYTES_PER_S`] a second per reader (output beyond that is skipped
//! and the next chunk says how much). Every reader, not only a follow,
//! ends when the server stops renewing it ([`LOG_FOLLOW_LEASE`]), and says
//! so. At most [`MAX_READERS`] readers run at once. Each reader is a
//! thread of its own (file reads on a slow SD card never hold up the
//! agent's event loop).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s4r_api::protocol::{
    encode, LogChunk, LogRequest, LogStream, Topics, LOG_FOLLOW_LEASE, MAX_LOG_CHUNK_BYTES, PROTOCOL_VERSION,
};
use rumqttc::{AsyncClient, QoS};

mod history;
use history::{send_history, tail_of};

/// Readers at once, per robot.
pub const MAX_READERS: usize = 8;
/// Output a reader sends per second, at most (bursts up to four times).
pub const RATE_BYTES_PER_S: u64 = 1 << 20;
/// How often a follower looks for new output.
const POLL: Duration = Duration::from_millis(100);
/// Chunks in a row that may find the client's queue full before a reader
/// gives up (about a second each).
const MAX_SEND_FAILURES: u32 = 5;
/// Bytes read from a file at a time.
const BLOCK: usize = 64 * 1024;
/// Most of what is on disk `--tail` looks through for its lines (it holds
/// them in memory).
const MAX_TAIL_BYTES: u64 = 64 << 20;

/// Where chunks go: the MQTT client in the agent, a list in tests.
pub trait ChunkSink: Send + 'static {
    /// Sends one chunk; false when it could not be queued.
    fn send(&self, chunk: &LogChunk) -> bool;
}

/// Publishes chunks of one task at QoS 0.
struct Mqtt {
    client: AsyncClient,
    topic: String,
}

impl ChunkSink for Mqtt {
    fn send(&self, chunk: &LogChunk) -> bool {
        self.client
            .try_publish(&self.topic, QoS::AtMostOnce, false, encode(chunk))
            .is_ok()
    }
}

struct Reader {
    stop: Arc<AtomicBool>,
    /// When the lease ends, in ms since `epoch`.
    lease_until: Arc<AtomicU64>,
    /// Chunks below this number have reached the server's reader.
    acked: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

/// The readers of one agent.
pub struct LogReaders {
    client: AsyncClient,
    topics: Topics,
    robot_id: String,
    tasks_dir: PathBuf,
    readers: HashMap<String, Reader>,
    epoch: Instant,
}

impl LogReaders {
    /// Readers of the task directories under `tasks_dir`.
    pub fn new(client: AsyncClient, topics: Topics, robot_id: String, tasks_dir: PathBuf) -> Self {
        LogReaders {
            client,
            topics,
            robot_id,
            tasks_dir,
            readers: HashMap::new(),
            epoch: Instant::now(),
        }
    }

    fn lease_end(&self) -> u64 {
        u64::try_from((self.epoch.elapsed() + LOG_FOLLOW_LEASE).as_millis()).unwrap_or(u64::MAX)
    }

    /// Acts on a request: starts a reader, renews or stops one.
    pub fn handle(&mut self, request: LogRequest) {
        self.readers.retain(|_, r| !r.done.load(Ordering::Relaxed));
        if request.stop {
            if let Some(reader) = self.readers.remove(&request.request_id) {
                reader.stop.store(true, Ordering::Relaxed);
            }
            return;
        }
        if let Some(reader) = self.readers.get(&request.request_id) {
            reader.lease_until.store(self.lease_end(), Ordering::Relaxed);
            if let Some(acked) = request.acked {
                reader.acked.fetch_max(acked, Ordering::Relaxed);
            }
            return;
        }
        if !valid_uid(&request.task_uid) {
            tracing::warn!(uid = %request.task_uid, "log request for an invalid task uid refused");
            return;
        }
        let sink = Mqtt {
            client: self.client.clone(),
            topic: self.topics.log_chunk(&self.robot_id, &request.task_uid),
        };
        if request.renew {
            sink.send(&LogChunk {
                eof: true,
                error: Some(format!(
                    "robot {} no longer has this log reader (its agent restarted, or the follow lapsed)",
                    self.robot_id
                )),
                ..chunk(&request.request_id, 0)
            });
            return;
        }
        if self.readers.len() >= MAX_READERS {
            let refusal = chunk(&request.request_id, 0);
            sink.send(&LogChunk {
                eof: true,
                error: Some(format!(
                    "robot {} already serves {MAX_READERS} log readers; try again later",
                    self.robot_id
                )),
                ..refusal
            });
            return;
        }
        let reader = Reader {
            stop: Arc::new(AtomicBool::new(false)),
            lease_until: Arc::new(AtomicU64::new(self.lease_end())),
            acked: Arc::new(AtomicU64::new(0)),
            done: Arc::new(AtomicBool::new(false)),
        };
        let job = Job {
            dir: task_logs_dir(&self.tasks_dir, &request.task_uid, request.attempt),
            robot_id: self.robot_id.clone(),
            request: request.clone(),
            stop: Arc::clone(&reader.stop),
            lease_until: Arc::clone(&reader.lease_until),
            acked: Arc::clone(&reader.acked),
            epoch: self.epoch,
        };
        let done = Arc::clone(&reader.done);
        let spawned = std::thread::Builder::new()
            .name("k8s4r-log-reader".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                job.run(&sink);
                done.store(true, Ordering::Relaxed);
            });
        match spawned {
            Ok(_) => {
                self.readers.insert(request.request_id, reader);
            }
            Err(e) => tracing::warn!(error = %e, "cannot start a log reader"),
        }
    }

    /// Stops every reader (the agent is leaving).
    pub fn stop_all(&mut self) {
        for reader in self.readers.values() {
            reader.stop.store(true, Ordering::Relaxed);
        }
        self.readers.clear();
    }
}

/// A task uid as Kubernetes makes them (a UUID): letters, digits and
/// dashes, so that it never names another path.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The directory an attempt's logs are in.
pub fn task_logs_dir(tasks_dir: &Path, uid: &str, attempt: u32) -> PathBuf {
    crate::supervisor::task_dir(tasks_dir, uid, attempt).join("logs")
}

fn chunk(request_id: &str, seq: u64) -> LogChunk {
    LogChunk {
        v: PROTOCOL_VERSION,
        request_id: request_id.to_owned(),
        seq,
        data: String::new(),
        skipped: 0,
        eof: false,
        caught_up: false,
        error: None,
    }
}

/// A token bucket of bytes.
struct Rate {
    tokens: f64,
    last: Instant,
}

impl Rate {
    fn new() -> Self {
        Rate {
            tokens: (RATE_BYTES_PER_S * 4) as f64,
            last: Instant::now(),
        }
    }

    /// Takes `n` bytes' worth if there is room.
    fn take(&mut self, n: usize) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * RATE_BYTES_PER_S as f64;
        self.tokens = (self.tokens + refill).min((RATE_BYTES_PER_S * 4) as f64);
        self.last = now;
        if self.tokens >= n as f64 {
            self.tokens -= n as f64;
            true
        } else {
            false
        }
    }
}

/// One file being followed.
struct Followed {
    path: PathBuf,
    file: Option<File>,
    inode: u64,
    offset: u64,
}

struct Job {
    dir: PathBuf,
    robot_id: String,
    request: LogRequest,
    stop: Arc<AtomicBool>,
    lease_until: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    epoch: Instant,
}

/// What a reader sends, with its numbering and its rate.
struct Out<'s> {
    sink: &'s dyn ChunkSink,
    request_id: String,
    seq: u64,
    skipped: u64,
    rate: Rate,
    stop: Arc<AtomicBool>,
    lease_until: Arc<AtomicU64>,
    /// How far the server has delivered, and how far beyond that the
    /// reader may send (None: the server does not acknowledge).
    acked: Arc<AtomicU64>,
    window: Option<u64>,
    epoch: Instant,
    /// Chunks in a row that found no room: past a few, the link is down
    /// and the reader gives up.
    failures: u32,
}

impl Out<'_> {
    /// Whether to go on: not stopped, renewed in time, the link alive.
    fn alive(&self) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        !self.stop.load(Ordering::Relaxed)
            && now <= self.lease_until.load(Ordering::Relaxed)
            && self.failures < MAX_SEND_FAILURES
    }

    /// Whether the lease ran out (the server stopped renewing).
    fn lapsed(&self) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        !self.stop.load(Ordering::Relaxed) && now > self.lease_until.load(Ordering::Relaxed)
    }

    /// Waits until the window has room for one more chunk (or the reader
    /// ends).
    fn wait_for_window(&self, window: u64) {
        while self.alive() && self.seq >= self.acked.load(Ordering::Relaxed).saturating_add(window) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `data` in chunks; waits for room in the client's queue, and
    /// skips (counting) what exceeds the rate when `may_skip` (live
    /// output). What is on disk (`!may_skip`) is paced by the server's
    /// window when it has one, else by the rate.
    fn data(&mut self, mut data: &[u8], may_skip: bool) {
        while !data.is_empty() && self.alive() {
            let n = utf8_boundary(data, MAX_LOG_CHUNK_BYTES);
            if let Some(window) = self.window {
                self.wait_for_window(window);
                if !self.alive() {
                    return;
                }
            }
            let paced_by_window = self.window.is_some() && !may_skip;
            if !paced_by_window && !self.rate.take(n) {
                if may_skip {
                    self.skipped += data.len() as u64;
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let mut c = chunk(&self.request_id, self.seq);
            c.data = String::from_utf8_lossy(&data[..n]).into_owned();
            c.skipped = std::mem::take(&mut self.skipped);
            if self.send(c) {
                data = &data[n..];
            }
        }
    }

    /// Sends one chunk, waiting a little for room; false if there was none.
    fn send(&mut self, c: LogChunk) -> bool {
        for _ in 0..50 {
            if self.sink.send(&c) {
                self.seq += 1;
                self.failures = 0;
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Lost to a full queue: the receiver sees the gap in the numbers.
        self.seq += 1;
        self.failures += 1;
        false
    }

    /// Says that everything written before the request is sent.
    fn caught_up(&mut self) {
        let mut c = chunk(&self.request_id, self.seq);
        c.caught_up = true;
        c.skipped = std::mem::take(&mut self.skipped);
        self.send(c);
    }

    fn end(&mut self, error: Option<String>) {
        let mut c = chunk(&self.request_id, self.seq);
        c.eof = true;
        c.error = error;
        c.skipped = std::mem::take(&mut self.skipped);
        self.send(c);
    }
}

/// The largest prefix of `data` of at most `max` bytes that does not split
/// a UTF-8 character (unless there is none).
fn utf8_boundary(data: &[u8], max: usize) -> usize {
    if data.len() <= max {
        return data.len();
    }
    let mut n = max;
    while n > max - 4 && n > 0 && (data[n] & 0xC0) == 0x80 {
        n -= 1;
    }
    if n == 0 {
        max
    } else {
        n
    }
}

impl Job {
    fn streams(&self) -> Vec<LogStream> {
        match self.request.stream {
            LogStream::All => vec![LogStream::Stdout, LogStream::Stderr],
            s => vec![s],
        }
    }

    fn run(&self, sink: &dyn ChunkSink) {
        let mut out = Out {
            sink,
            request_id: self.request.request_id.clone(),
            seq: 0,
            skipped: 0,
            rate: Rate::new(),
            stop: Arc::clone(&self.stop),
            lease_until: Arc::clone(&self.lease_until),
            acked: Arc::clone(&self.acked),
            window: self.request.window.map(u64::from),
            epoch: self.epoch,
            failures: 0,
        };
        if !self.dir.is_dir() {
            out.end(Some(format!(
                "robot {} keeps no output of attempt {} of this task (it never ran there, or its directory was cleaned up)",
                self.robot_id, self.request.attempt
            )));
            return;
        }
        let mut followed = Vec::new();
        for stream in self.streams() {
            let (mut history, follow) = self.open_stream(stream);
            followed.push(follow);
            match self.request.tail_lines {
                Some(n) => out.data(&tail_of(&mut history, n), false),
                None => send_history(&mut history, &mut out),
            }
        }
        if !self.request.follow {
            let cut = out
                .lapsed()
                .then(|| "the server stopped asking for this read before it was through".to_owned());
            out.end(cut);
            return;
        }
        out.caught_up();
        let mut buf = vec![0u8; MAX_LOG_CHUNK_BYTES * 4];
        while out.alive() {
            for f in &mut followed {
                follow_once(f, &mut buf, &mut out);
            }
            std::thread::sleep(POLL);
        }
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        out.end(Some("nobody follows any more".into()));
    }
}

/// Reads what a followed file gained since the last look, across a
/// rotation (the file renamed and a new one started: the rest of the old
/// one is read first) or a truncation (copy-and-truncate: what was written
/// between the last look and the truncation is in `.1`, and counted as
/// skipped).
fn follow_once(f: &mut Followed, buf: &mut [u8], out: &mut Out<'_>) {
    loop {
        if f.file.is_none() {
            match File::open(&f.path) {
                Ok(file) => {
                    f.inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
                    f.offset = 0;
                    f.file = Some(file);
                }
                Err(_) => return,
            }
        }
        let Some(file) = f.file.as_mut() else {
            return;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < f.offset {
            // Truncated in place (a service's log, copy-and-truncate): go on
            // from its start.
            f.offset = 0;
        }
        if file.seek(SeekFrom::Start(f.offset)).is_err() {
            return;
        }
        let mut progressed = false;
        while let Ok(n) = file.read(buf) {
            if n == 0 {
                break;
            }
            f.offset += n as u64;
            out.data(&buf[..n], true);
            progressed = true;
        }
        let renamed = std::fs::metadata(&f.path).map_or(true, |m| m.ino() != f.inode);
        if renamed {
            // What reached the old file between the read above and the
            // rename is read now; then on with the new one.
            while let Ok(n) = file.read(buf) {
                if n == 0 {
                    break;
                }
                f.offset += n as u64;
                out.data(&buf[..n], true);
            }
            f.file = None;
            continue;
        }
        if !progressed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::history::last_lines;
    use super::*;
    use std::io::Write;
    use std::sync::Mutex;

    #[derive(Default, Clone)]
    struct Collect(Arc<Mutex<Vec<LogChunk>>>);

    impl ChunkSink for Collect {
        fn send(&self, chunk: &LogChunk) -> bool {
            self.0.lock().unwrap().push(chunk.clone());
            true
        }
    }

    impl Collect {
        fn text(&self) -> String {
            self.0.lock().unwrap().iter().map(|c| c.data.as_str()).collect()
        }
        fn ended(&self) -> bool {
            self.0.lock().unwrap().iter().any(|c| c.eof)
        }
    }

    fn request(follow: bool) -> LogRequest {
        LogRequest {
            v: PROTOCOL_VERSION,
            request_id: "r1".into(),
            task_uid: "u".into(),
            attempt: 1,
            stream: LogStream::Stdout,
            tail_lines: None,
            since: None,
            follow,
            stop: false,
            renew: false,
            window: None,
            acked: None,
        }
    }

    fn job(dir: &Path, request: LogRequest) -> Job {
        Job {
            dir: dir.to_path_buf(),
            robot_id: "rb".into(),
            request,
            stop: Arc::new(AtomicBool::new(false)),
            lease_until: Arc::new(AtomicU64::new(u64::MAX)),
            acked: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
        }
    }

    #[test]
    fn the_whole_log_comes_oldest_first_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdout.log.2"), "one\n").unwrap();
        std::fs::write(dir.path().join("stdout.log.1"), "two\n").unwrap();
        std::fs::write(dir.path().join("stdout.log"), "three\n").unwrap();
        std::fs::write(dir.path().join("stderr.log"), "oops\n").unwrap();
        let sink = Collect::default();
        job(dir.path(), request(false)).run(&sink);
        assert_eq!(sink.text(), "one\ntwo\nthree\n");
        assert!(sink.ended());
        let all = Collect::default();
        job(
            dir.path(),
            LogRequest {
                stream: LogStream::All,
                tail_lines: Some(2),
                ..request(false)
            },
        )
        .run(&all);
        assert_eq!(all.text(), "two\nthree\noops\n");
        let seqs: Vec<u64> = all.0.lock().unwrap().iter().map(|c| c.seq).collect();
        assert_eq!(
            seqs,
            (0..seqs.len() as u64).collect::<Vec<_>>(),
            "numbered without gaps"
        );
    }

    #[test]
    fn since_reads_from_the_time_index_not_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdout.log"), "early\nlate\n").unwrap();
        std::fs::create_dir(dir.path().join(crate::supervisor::log_times::DIR)).unwrap();
        let now = jiff::Timestamp::now();
        let (then, recent) = (now.as_millisecond() - 60_000, now.as_millisecond() - 1_000);
        std::fs::write(
            crate::supervisor::log_times::index_path(&dir.path().join("stdout.log")).unwrap(),
            format!("{then} 0 1000\n{recent} 6 1000\n"),
        )
        .unwrap();
        let since = |ago_ms: i64| {
            let sink = Collect::default();
            let at = jiff::Timestamp::from_millisecond(now.as_millisecond() - ago_ms).unwrap();
            job(
                dir.path(),
                LogRequest {
                    since: Some(at),
                    ..request(false)
                },
            )
            .run(&sink);
            sink.text()
        };
        assert_eq!(since(2_000), "late\n", "early was written a minute ago");
        assert_eq!(since(1_500), "late\n");
        assert_eq!(since(120_000), "early\nlate\n", "all of it is newer");
    }

    #[test]
    fn a_missing_attempt_is_answered_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Collect::default();
        job(&dir.path().join("nope"), request(false)).run(&sink);
        let chunks = sink.0.lock().unwrap();
        assert!(chunks[0].eof);
        assert!(chunks[0]
            .error
            .as_deref()
            .unwrap()
            .contains("keeps no output of attempt 1"));
    }

    #[test]
    fn following_sends_new_output_across_a_rotation_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        std::fs::write(&path, "before\n").unwrap();
        let sink = Collect::default();
        let j = job(dir.path(), request(true));
        let stop = Arc::clone(&j.stop);
        let reader = {
            let sink = sink.clone();
            std::thread::spawn(move || j.run(&sink))
        };
        let wait_for = |text: &str| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !sink.text().contains(text) {
                assert!(Instant::now() < deadline, "never saw {text:?}: {:?}", sink.text());
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        wait_for("before\n");
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, "live").unwrap();
        wait_for("live\n");
        writeln!(f, "last of the old file").unwrap();
        std::fs::rename(&path, dir.path().join("stdout.log.1")).unwrap();
        std::fs::write(&path, "first of the new\n").unwrap();
        wait_for("first of the new\n");
        assert_eq!(
            sink.text(),
            "before\nlive\nlast of the old file\nfirst of the new\n"
        );
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    }

    #[test]
    fn a_follow_nobody_renews_ends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdout.log"), "x\n").unwrap();
        let sink = Collect::default();
        let j = job(dir.path(), request(true));
        j.lease_until.store(0, Ordering::Relaxed);
        j.run(&sink);
        let chunks = sink.0.lock().unwrap();
        assert_eq!(
            chunks.last().unwrap().error.as_deref(),
            Some("nobody follows any more")
        );
    }

    #[test]
    fn a_read_nobody_renews_ends_saying_it_was_cut() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdout.log"), "x\n").unwrap();
        let sink = Collect::default();
        let mut j = job(dir.path(), request(false));
        // Renewed last a second ago, for no time at all.
        j.epoch = Instant::now() - Duration::from_secs(1);
        j.lease_until.store(0, Ordering::Relaxed);
        j.run(&sink);
        let chunks = sink.0.lock().unwrap();
        let last = chunks.last().unwrap();
        assert!(last.eof);
        assert!(
            last.error
                .as_deref()
                .is_some_and(|e| e.contains("stopped asking")),
            "{last:?}"
        );
    }

    #[test]
    fn a_read_with_a_window_waits_for_acknowledgements_and_sends_everything() {
        let dir = tempfile::tempdir().unwrap();
        // More than the rate's burst: without the window it would be paced
        // to a megabyte a second.
        let big: Vec<u8> = (0..6 * 1024 * 1024u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(dir.path().join("stdout.log"), &big).unwrap();
        let sink = Collect::default();
        let j = job(
            dir.path(),
            LogRequest {
                window: Some(4),
                ..request(false)
            },
        );
        let acked = Arc::clone(&j.acked);
        let reader = {
            let sink = sink.clone();
            std::thread::spawn(move || j.run(&sink))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.0.lock().unwrap().len() < 4 {
            assert!(Instant::now() < deadline, "the first window never went out");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            sink.0.lock().unwrap().len(),
            4,
            "no more than the window before an ack"
        );
        let started = Instant::now();
        while !sink.ended() {
            let sent = sink.0.lock().unwrap().len() as u64;
            acked.store(sent, Ordering::Relaxed);
            assert!(Instant::now() < deadline, "the read never ended");
            std::thread::sleep(Duration::from_millis(1));
        }
        reader.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "paced by the acks, not the rate"
        );
        assert_eq!(sink.text().as_bytes(), &big[..]);
        let chunks = sink.0.lock().unwrap();
        assert!(chunks.iter().all(|c| c.skipped == 0 && c.error.is_none()));
    }

    #[test]
    fn a_tail_is_read_from_the_end_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let big: String = (0..20_000).map(|i| format!("{i}\n")).collect();
        std::fs::write(dir.path().join("stdout.log.1"), &big).unwrap();
        std::fs::write(dir.path().join("stdout.log"), "last\n").unwrap();
        let sink = Collect::default();
        job(
            dir.path(),
            LogRequest {
                tail_lines: Some(3),
                ..request(false)
            },
        )
        .run(&sink);
        assert_eq!(sink.text(), "19998\n19999\nlast\n");
    }

    #[test]
    fn only_a_task_uid_names_a_directory() {
        assert!(valid_uid("0b8c9e2a-5f0e-4f5e-9a3c-1d2e3f4a5b6c"));
        assert!(!valid_uid("../../etc"));
        assert!(!valid_uid("/etc/passwd"));
        assert!(!valid_uid(""));
    }

    #[test]
    fn lines_and_boundaries() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\n", 5), b"a\n");
        assert_eq!(last_lines(b"a\n", 0), b"");
        let s = "é".repeat(10);
        let n = utf8_boundary(s.as_bytes(), 5);
        assert_eq!(n, 4);
    }
}
