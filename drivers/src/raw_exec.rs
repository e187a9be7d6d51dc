//! `raw_exec`: the command as the agent's user, in its own session.

use std::path::Path;

use k8s4r_api::task::DRIVER_RAW_EXEC;
use k8s4r_api::TaskTemplate;

use crate::launch::{self, Isolation};
use crate::{resolve_cwd, Driver, DriverError, Launch, Launched, Limits, Prepared};

/// Runs tasks unisolated, with the agent's environment plus the task's.
#[derive(Debug, Default)]
pub struct RawExecDriver;

impl Driver for RawExecDriver {
    fn name(&self) -> &'static str {
        DRIVER_RAW_EXEC
    }

    fn prepare(&self, template: &TaskTemplate, task_dir: &Path) -> Result<Prepared, DriverError> {
        Ok(Prepared {
            identity: None,
            task_dir: task_dir.to_path_buf(),
            cwd: resolve_cwd(template, task_dir)?,
            limits: Limits::default(),
        })
    }

    fn start(&self, launch: Launch<'_>) -> Result<Launched, DriverError> {
        launch::spawn(
            launch,
            Isolation {
                clean_env: None,
                no_new_privs: false,
                address_space: None,
            },
        )
    }
}
