//! Where the log chunks and session frames robots send go: to the reader
//! or the session waiting for them in this server. The MQTT connection
//! offers every `.../log` and `.../out` message here before the per-robot
//! queues; the logs API ([`crate::logs`]) opens a route per reader or
//! session and closes it when it is over.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s4r_api::protocol::{decode, LogChunk, Topic, TopicKind, Topics};
use k8s4r_service::lock;
use tokio::sync::mpsc;
use tracing::debug;

/// Readers at once, for the whole server.
const MAX_SESSIONS: usize = 256;
/// Exec, port-forward and copy sessions at once, for the whole server.
const MAX_REMOTE_SESSIONS: usize = 1024;
/// Frames waiting for a session beyond its window (credits, keepalives).
const SESSION_QUEUE: usize = 128;
/// Chunks waiting for a slow reader before more are dropped (and shown as
/// a gap).
const CHUNK_QUEUE: usize = 256;

/// A session's robot, and where its frames go.
type SessionRoute = (String, mpsc::Sender<Vec<u8>>);

struct Route {
    robot: String,
    task_uid: String,
    tx: mpsc::Sender<LogChunk>,
}

/// Routes the chunks robots send to the readers waiting for them.
pub struct LogHub {
    topics: Topics,
    routes: Mutex<HashMap<String, Route>>,
    /// Session id → (robot, where its frames go).
    sessions: Mutex<HashMap<String, SessionRoute>>,
}

impl LogHub {
    /// A hub for topics under `topics`.
    pub fn new(topics: Topics) -> Self {
        LogHub {
            topics,
            routes: Mutex::default(),
            sessions: Mutex::default(),
        }
    }

    /// Takes one message from the broker if it is a log chunk (true), for
    /// the reader it names; one for nobody, or from the wrong robot or
    /// task, is dropped.
    pub fn offer(&self, topic: &str, payload: &[u8]) -> bool {
        let (robot_id, task_uid) = match self.topics.parse(topic) {
            Ok(Topic::Robot {
                robot_id,
                kind: TopicKind::LogChunk { task_uid },
            }) => (robot_id, task_uid),
            Ok(Topic::Robot {
                robot_id,
                kind: TopicKind::SessionOut { session },
            }) => {
                let sessions = lock(&self.sessions);
                match sessions.get(&session) {
                    // A full queue: the robot sends beyond its credits; the
                    // session sees the gap and ends.
                    Some((robot, tx)) if *robot == robot_id => {
                        let _ = tx.try_send(payload.to_vec());
                    }
                    _ => debug!(topic, "session frame for no session here"),
                }
                return true;
            }
            _ => return false,
        };
        // Nobody reads this robot's task here: dropped before decoding, so
        // that a robot sending unasked costs nothing.
        let asked = lock(&self.routes)
            .values()
            .any(|r| r.robot == robot_id && r.task_uid == task_uid);
        if !asked {
            return true;
        }
        let Ok(chunk) = decode::<LogChunk>(payload) else {
            debug!(topic, "undecodable log chunk dropped");
            return true;
        };
        let routes = lock(&self.routes);
        match routes.get(&chunk.request_id) {
            Some(route) if route.robot == robot_id && route.task_uid == task_uid => {
                // A full queue drops it: the reader sees the gap.
                let _ = route.tx.try_send(chunk);
            }
            _ => debug!(topic, request = %chunk.request_id, "log chunk for no reader here"),
        }
        true
    }

    /// A route for reader `id` of `task_uid`'s output on `robot`; None when
    /// the server has as many readers as it takes.
    pub fn open(&self, id: &str, robot: &str, task_uid: &str) -> Option<mpsc::Receiver<LogChunk>> {
        let mut routes = lock(&self.routes);
        if routes.len() >= MAX_SESSIONS {
            return None;
        }
        let (tx, rx) = mpsc::channel(CHUNK_QUEUE);
        routes.insert(
            id.to_owned(),
            Route {
                robot: robot.to_owned(),
                task_uid: task_uid.to_owned(),
                tx,
            },
        );
        Some(rx)
    }

    /// Ends reader `id`'s route.
    pub fn close(&self, id: &str) {
        lock(&self.routes).remove(id);
    }

    /// A route for the frames of session `id` with `robot`; None when the
    /// server has as many sessions as it takes.
    pub fn open_session(&self, id: &str, robot: &str) -> Option<mpsc::Receiver<Vec<u8>>> {
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= MAX_REMOTE_SESSIONS {
            return None;
        }
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        sessions.insert(id.to_owned(), (robot.to_owned(), tx));
        Some(rx)
    }

    /// Ends session `id`'s route.
    pub fn close_session(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }
}
