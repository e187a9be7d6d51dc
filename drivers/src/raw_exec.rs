//! `raw_exec`: the command as the agent's user, in its own session, with
//! the task's declared environment only. Robots offer it only when their
//! configuration says so: on a robot the agent's user is root.

use std::path::Path;

use k8s4r_api::task::DRIVER_RAW_EXEC;
use k8s4r_api::TaskTemplate;

use crate::launch::{self, Isolation};
use crate::{
    base_env, resolve_cwd, user_name, Driver, DriverError, Identity, Launch, Launched, Limits, Prepared,
};

/// Runs tasks unisolated, as the agent's user.
#[derive(Debug, Default)]
pub struct RawExecDriver {
    pids_max: Option<u64>,
}

impl RawExecDriver {
    /// A raw_exec driver whose tasks get `pids_max` in their cgroup (where
    /// there is one): not isolation, but a fork bomb stays one task's.
    pub fn with_pids_max(pids_max: Option<u64>) -> Self {
        RawExecDriver { pids_max }
    }
}

impl Driver for RawExecDriver {
    fn name(&self) -> &'static str {
        DRIVER_RAW_EXEC
    }

    fn prepare(
        &self,
        template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError> {
        Ok(Prepared {
            user: user_name(identity.as_ref()),
            // The agent's user; only its supplementary groups may be set.
            identity,
            task_dir: task_dir.to_path_buf(),
            cwd: resolve_cwd(template, task_dir)?,
            limits: Limits {
                pids: self.pids_max,
                ..Limits::default()
            },
            config_env: Default::default(),
        })
    }

    fn start(&self, launch: Launch<'_>) -> Result<Launched, DriverError> {
        if let Some(cgroup) = launch.cgroup {
            // Best effort: without the pids controller the task is unbounded,
            // as the agent's user always was.
            let _ = cgroup.apply(&launch.prepared.limits);
        }
        let env = base_env(&launch.prepared.user, &launch.prepared.task_dir);
        launch::spawn(
            launch,
            Isolation {
                base_env: env,
                no_new_privs: false,
                address_space: None,
                processes: None,
                kill_also: None,
            },
        )
    }
}
