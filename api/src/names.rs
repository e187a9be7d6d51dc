//! Every name the programs agree on, defined once: labels, annotations,
//! finalizers, field managers, condition types, the
//! environment a task sees, and the default namespaces and Secret of a
//! deployment. Kind names come from the types themselves (`K::kind(&())`).

/// Label on TaskGroups and Tasks: the owning Job's name.
pub const LABEL_JOB: &str = "robot.k8s4r.io/job";
/// Label on Tasks: the group's name within its Job.
pub const LABEL_GROUP: &str = "robot.k8s4r.io/group";
/// Label on Tasks: the task's index within its group.
pub const LABEL_INDEX: &str = "robot.k8s4r.io/index";
/// Label on the Tasks of an everyRobot group: the robot the task is for.
pub const LABEL_ROBOT: &str = "robot.k8s4r.io/robot";
/// Label on the Jobs a PeriodicJob creates: the PeriodicJob's name.
pub const LABEL_PERIODIC_JOB: &str = "robot.k8s4r.io/periodic-job";
/// Annotation on the Jobs a PeriodicJob creates: the scheduled time of the
/// run (RFC 3339), as Kubernetes' CronJob controller records it.
pub const ANNOTATION_SCHEDULED_AT: &str = "robot.k8s4r.io/scheduled-at";
/// Finalizer the server holds on a dispatched Task until the robot has
/// stopped it (or is offline).
pub const FINALIZER_CANCEL: &str = "robot.k8s4r.io/cancel-on-robot";
/// Annotation on a Robot: hex SHA-256 of the bootstrap token it last
/// registered with (the server writes it, the manager checks it).
pub const ANNOTATION_TOKEN_SHA256: &str = "robot.k8s4r.io/bootstrap-token-sha256";
/// Annotation on a Task: the highest attempt whose dispatch the broker
/// acknowledged (the server writes it, the manager's dispatch timeout
/// reads it).
pub const ANNOTATION_DISPATCHED_ATTEMPT: &str = "robot.k8s4r.io/dispatched-attempt";
/// Annotation on a Task: the highest attempt the server is about to
/// publish (written, guarded by the Task's resourceVersion, before the
/// publish): an attempt at or below it may be running on its robot, so a
/// cancel must reach the robot (see [`crate::task::sent_attempt`]).
pub const ANNOTATION_SENDING_ATTEMPT: &str = "robot.k8s4r.io/sending-attempt";
/// Annotation on a running Task (the manager sets it): take the
/// configuration from ConfigMaps and Secrets again, as JSON
/// ([`crate::config_ref::ConfigRefresh`]); the server sends it to the robot.
pub const ANNOTATION_CONFIG_REFRESH: &str = "robot.k8s4r.io/config-refresh";
/// Annotation on a Task, TaskGroup or Job: stop what runs and mark it
/// cancelled, keeping it. Each new value acts once.
pub const ANNOTATION_CANCEL: &str = "robot.k8s4r.io/cancel";
/// Annotation on a failed Task (or a TaskGroup or Job: their failed
/// Tasks): start a new attempt with the retry budget reset. Each new value
/// acts once.
pub const ANNOTATION_RETRY: &str = "robot.k8s4r.io/retry";
/// Annotation on a Task (`k8s4r drain` sets it): stop the current attempt
/// on its robot and run the task elsewhere, without using a retry. Each
/// new value acts once.
pub const ANNOTATION_EVICT: &str = "robot.k8s4r.io/evict";
/// Annotation on a Robot (the manager sets it): the AgentRollout whose
/// version this robot is to run now; the server sends the robot the order.
pub const ANNOTATION_AGENT_ROLLOUT: &str = "robot.k8s4r.io/agent-rollout";
/// On a Robot: the AgentRollout that cordoned it while it waits for its
/// running tasks to end (`waitForTasks`); the rollout uncordons it once it
/// no longer waits. A robot a person cordoned carries no such mark, and
/// the rollout leaves it cordoned.
pub const ANNOTATION_CORDONED_FOR_ROLLOUT: &str = "robot.k8s4r.io/cordoned-for-rollout";
/// Annotation beside `cancel` or `retry`: who asked (`k8s4r cancel|retry`
/// write the user's name).
pub const ANNOTATION_REQUESTED_BY: &str = "robot.k8s4r.io/requested-by";
/// Field manager of the server's writes.
pub const MANAGER_SERVER: &str = "k8s4r-server";
/// Field manager of the manager's writes.
pub const MANAGER_CONTROLLERS: &str = "k8s4r-manager";

/// Namespace of the cluster programs, the bootstrap-token Secret and the
/// manager's leader Lease.
pub const DEFAULT_NAMESPACE: &str = "k8s4r-system";
/// Namespace of the per-robot Leases the server renews (and the server's
/// leader Lease).
pub const DEFAULT_ROBOT_LEASE_NAMESPACE: &str = "k8s4r-robot-leases";
/// Secret whose values are the accepted bootstrap tokens.
pub const DEFAULT_BOOTSTRAP_SECRET: &str = "k8s4r-bootstrap-tokens";
/// The key of that Secret under which the docs and `k8s4r up` keep the
/// fleet's token (the manager accepts the value of every key, so that a
/// new token can be added beside the old one while robots change over).
pub const BOOTSTRAP_TOKEN_KEY: &str = "fleet";

/// Robot condition (the manager's): approved and heartbeating.
pub const CONDITION_READY: &str = "Ready";
/// Robot condition (the manager's): the bootstrap token was accepted.
pub const CONDITION_APPROVED: &str = "Approved";
/// Robot condition (the server's): connected to the broker.
pub const CONDITION_CONNECTED: &str = "Connected";
/// Robot condition (the server's, from the agent's heartbeat): the agent
/// takes new tasks, or why not (reasons from `AgentHealth`).
pub const CONDITION_ACCEPTING_TASKS: &str = "AcceptingTasks";
/// Task condition (the manager's): placed on a robot, or why not.
pub const CONDITION_SCHEDULED: &str = "Scheduled";
/// Job and TaskGroup condition: every task completed.
pub const CONDITION_COMPLETE: &str = "Complete";
/// Job and TaskGroup condition: failed, and why.
pub const CONDITION_FAILED: &str = "Failed";

/// Environment of every task: the Task's uid.
pub const ENV_TASK_UID: &str = "K8S4R_TASK_UID";
/// Environment of every task: the attempt number (1 for the first).
pub const ENV_TASK_ATTEMPT: &str = "K8S4R_TASK_ATTEMPT";
/// Environment of every task: `namespace/name` of the Task.
pub const ENV_TASK_NAME: &str = "K8S4R_TASK_NAME";
/// Environment of every task: the id of the robot it runs on.
pub const ENV_ROBOT_ID: &str = "K8S4R_ROBOT_ID";
/// Environment of every task: its task directory on the robot.
pub const ENV_TASK_DIR: &str = "K8S4R_TASK_DIR";
