//! Every Robot's phase, as one watch sees it for the whole run.

use k8s4r_api::{Robot, RobotPhase};
use kube::{Api, Client, ResourceExt};

/// Every Robot's phase as a watch shows it, for the whole run: counting
/// Online robots by listing them all every few seconds was itself a load
/// at 100,000 robots (50 pages of full objects each time), where the watch
/// costs one more watcher, as `kubectl get robots -w` would.
#[derive(Clone, Default)]
pub struct Phases {
    inner: std::sync::Arc<std::sync::Mutex<PhaseMap>>,
}

#[derive(Default)]
struct PhaseMap {
    phase: std::collections::HashMap<String, Option<RobotPhase>>,
    online: usize,
    /// Robots seen Offline since [`Phases::mark`].
    offline_since_mark: std::collections::HashSet<String>,
}

impl PhaseMap {
    fn set(&mut self, name: String, phase: Option<RobotPhase>) {
        if phase == Some(RobotPhase::Offline) {
            self.offline_since_mark.insert(name.clone());
        }
        let online = phase == Some(RobotPhase::Online);
        let was = self.phase.insert(name, phase).flatten() == Some(RobotPhase::Online);
        match (was, online) {
            (false, true) => self.online += 1,
            (true, false) => self.online -= 1,
            _ => {}
        }
    }
}

impl Phases {
    pub fn start(client: &Client) -> (Self, tokio::task::JoinHandle<()>) {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let phases = Self::default();
        let robots: Api<Robot> = Api::all(client.clone());
        let map = phases.inner.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher::watcher(
                robots,
                watcher::Config::default().page_size(2000)
            ));
            while let Some(event) = events.next().await {
                let phase_of = |r: &Robot| r.status.as_ref().and_then(|s| s.phase);
                let mut map = map.lock().unwrap();
                match event {
                    Ok(Event::Apply(r) | Event::InitApply(r)) => map.set(r.name_any(), phase_of(&r)),
                    Ok(Event::Delete(r)) => map.set(r.name_any(), None),
                    _ => {}
                }
            }
        });
        (phases, task)
    }

    pub fn online(&self) -> usize {
        self.inner.lock().unwrap().online
    }

    pub fn phase(&self, name: &str) -> Option<RobotPhase> {
        self.inner.lock().unwrap().phase.get(name).copied().flatten()
    }

    /// Starts counting the robots seen Offline afresh.
    pub fn mark(&self) {
        self.inner.lock().unwrap().offline_since_mark.clear();
    }

    /// Robots seen Offline since the mark, or not Online now.
    pub fn offline_since_mark(&self) -> usize {
        let map = self.inner.lock().unwrap();
        let not_online = map
            .phase
            .iter()
            .filter(|(name, p)| **p != Some(RobotPhase::Online) && !map.offline_since_mark.contains(*name))
            .count();
        map.offline_since_mark.len() + not_online
    }
}
