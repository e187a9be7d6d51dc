//! Who a task runs as: from what the supervisor decided (a named user, a
//! task uid of its own, or the agent's user) to uid, gid and supplementary
//! gids, looked up in the robot's user and group databases.
//!
//! The robot's policy (which names are allowed at all) is applied before
//! this, without lookups; this step refuses what only a lookup reveals: a
//! name that does not exist, or one that turns out to be uid 0.

use nix::unistd::{geteuid, Group, User};

use crate::{DriverError, Identity};

/// The user a task asked for, as the supervisor decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// The agent's own user (raw_exec; exec when the agent is not root).
    Agent,
    /// A user from the robot's user database.
    Named(String),
    /// A uid of the task's own, from the robot's task uid range: in no
    /// database, its gid the same number (like systemd's DynamicUser).
    TaskUid(u32),
}

/// Resolves `run_as` and `groups` to an identity; None means the agent's
/// own. Blocking: it reads the user and group databases (NSS).
pub fn resolve(run_as: &RunAs, groups: &[String], allow_root: bool) -> Result<Option<Identity>, DriverError> {
    let agent = geteuid();
    let gids = || -> Result<Vec<u32>, DriverError> {
        groups
            .iter()
            .map(|name| match Group::from_name(name) {
                Ok(Some(group)) => Ok(group.gid.as_raw()),
                Ok(None) => Err(DriverError::UnknownGroup { group: name.clone() }),
                Err(source) => Err(DriverError::UserLookup {
                    user: name.clone(),
                    source,
                }),
            })
            .collect()
    };
    match run_as {
        RunAs::Agent if groups.is_empty() || !agent.is_root() => {
            if !groups.is_empty() {
                return Err(DriverError::CannotGrantGroups {
                    agent_uid: agent.as_raw(),
                });
            }
            Ok(None)
        }
        // The agent's user (root) with groups of the task's choosing.
        RunAs::Agent => Ok(Some(Identity {
            name: "root".to_owned(),
            uid: 0,
            gid: 0,
            groups: gids()?,
        })),
        RunAs::TaskUid(uid) => {
            if !agent.is_root() {
                return Err(DriverError::CannotSwitchUser {
                    user: format!("k8s4r-{uid}"),
                    agent_uid: agent.as_raw(),
                });
            }
            Ok(Some(Identity {
                name: format!("k8s4r-{uid}"),
                uid: *uid,
                gid: *uid,
                groups: gids()?,
            }))
        }
        RunAs::Named(name) => {
            let user = User::from_name(name)
                .map_err(|source| DriverError::UserLookup {
                    user: name.clone(),
                    source,
                })?
                .ok_or_else(|| DriverError::UnknownUser { user: name.clone() })?;
            if user.uid.is_root() && !allow_root {
                return Err(DriverError::RootNotAllowed { user: name.clone() });
            }
            if !agent.is_root() {
                if user.uid != agent {
                    return Err(DriverError::CannotSwitchUser {
                        user: name.clone(),
                        agent_uid: agent.as_raw(),
                    });
                }
                if !groups.is_empty() {
                    return Err(DriverError::CannotGrantGroups {
                        agent_uid: agent.as_raw(),
                    });
                }
                return Ok(None);
            }
            Ok(Some(Identity {
                name: name.clone(),
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
                groups: gids()?,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_looked_up_and_root_is_refused_unless_allowed() {
        if !geteuid().is_root() {
            return; // switching users needs root; covered by the root CI run
        }
        let nobody = resolve(&RunAs::Named("nobody".into()), &[], false)
            .unwrap()
            .unwrap();
        assert_eq!((nobody.uid, nobody.groups.as_slice()), (65534, &[][..]));
        let err = resolve(&RunAs::Named("root".into()), &[], false).unwrap_err();
        assert!(matches!(err, DriverError::RootNotAllowed { .. }), "{err}");
        let root = resolve(&RunAs::Named("root".into()), &[], true).unwrap().unwrap();
        assert_eq!(root.uid, 0);
        let err = resolve(&RunAs::Named("no-such-user-k8s4r".into()), &[], true).unwrap_err();
        assert!(matches!(err, DriverError::UnknownUser { .. }), "{err}");
    }

    #[test]
    fn a_task_uid_is_its_own_group_and_gets_exactly_its_groups() {
        if !geteuid().is_root() {
            return;
        }
        let id = resolve(&RunAs::TaskUid(70_001), &["root".into()], false)
            .unwrap()
            .unwrap();
        assert_eq!((id.uid, id.gid, id.groups.as_slice()), (70_001, 70_001, &[0][..]));
        assert_eq!(id.name, "k8s4r-70001");
        let err = resolve(&RunAs::TaskUid(70_001), &["no-such-group-k8s4r".into()], false).unwrap_err();
        assert!(matches!(err, DriverError::UnknownGroup { .. }), "{err}");
        assert_eq!(resolve(&RunAs::Agent, &[], false).unwrap(), None);
    }
}
