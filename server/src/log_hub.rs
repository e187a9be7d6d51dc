//! Where the log chunks robots send go: to the reader waiting for them in
//! this server. The MQTT connection offers every `.../log` message here
//! before the per-robot queues; the logs API ([`crate::logs`]) opens a
//! route per reader and closes it when the reader is gone.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s4r_api::protocol::{decode, LogChunk, Topic, TopicKind, Topics};
use k8s4r_service::lock;
use tokio::sync::mpsc;
use tracing::debug;

/// Readers at once, for the whole server.
const MAX_SESSIONS: usize = 256;
/// Chunks waiting for a slow reader before more are dropped (and shown as
/// a gap).
const CHUNK_QUEUE: usize = 256;

struct Route {
    robot: String,
    task_uid: String,
    tx: mpsc::Sender<LogChunk>,
}

/// Routes the chunks robots send to the readers waiting for them.
pub struct LogHub {
    topics: Topics,
    routes: Mutex<HashMap<String, Route>>,
}

impl LogHub {
    /// A hub for topics under `topics`.
    pub fn new(topics: Topics) -> Self {
        LogHub {
            topics,
            routes: Mutex::default(),
        }
    }

    /// Takes one message from the broker if it is a log chunk (true), for
    /// the reader it names; one for nobody, or from the wrong robot or
    /// task, is dropped.
    pub fn offer(&self, topic: &str, payload: &[u8]) -> bool {
        let Ok(Topic::Robot {
            robot_id,
            kind: TopicKind::LogChunk { task_uid },
        }) = self.topics.parse(topic)
        else {
            return false;
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
}
