use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::protocol::outputs::{OutputAsk, Want};
use k8s4r_api::{AttemptRecord, OutputState, OutputStatus, Task, TaskSpec, TaskState, TaskStatus};

use super::*;

const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

fn task(attempt: u32, robot: &str, earlier: &[(u32, &str)]) -> Task {
    let mut task = Task::new("survey-scan-0", TaskSpec::default());
    task.spec.template.outputs = vec![k8s4r_api::output::Output {
        path: "out/*.bag".into(),
        ..Default::default()
    }];
    task.metadata.namespace = Some("default".into());
    task.metadata.uid = Some("u-1".into());
    task.metadata.labels = Some([(LABEL_JOB.to_owned(), "survey".to_owned())].into());
    task.status = Some(TaskStatus {
        attempt,
        robot: Some(robot.into()),
        attempts: earlier
            .iter()
            .map(|(a, r)| AttemptRecord {
                attempt: *a,
                robot: Some((*r).into()),
                state: TaskState::Failed,
                exit_code: None,
                reason: None,
                message: None,
                start_time: None,
                finish_time: None,
            })
            .collect(),
        ..TaskStatus::default()
    });
    task
}

fn ask(want: Want) -> OutputAsk {
    OutputAsk {
        v: 1,
        robot_id: "rb7".into(),
        task_uid: "u-1".into(),
        attempt: 2,
        path: "out/run.bag".into(),
        size: 20 * 1024 * 1024,
        sha256: SHA.into(),
        part_size: 8 * 1024 * 1024,
        want,
    }
}

fn parts(upload_id: Option<&str>, parts: Vec<u32>) -> Want {
    Want::Parts {
        upload_id: upload_id.map(str::to_owned),
        parts,
    }
}

#[test]
fn the_key_names_namespace_job_task_attempt_robot_and_path() {
    let t = task(2, "rb7", &[(1, "rb3")]);
    assert_eq!(
        plan(&ask(parts(None, vec![1, 2, 3])), Some(&t), "rb7"),
        Ok(Plan::Begin {
            key: "default/survey/survey-scan-0/2/rb7/out/run.bag".into(),
            parts: vec![1, 2, 3],
        })
    );
    // An earlier attempt's output, from the robot it ran on.
    let earlier = OutputAsk {
        attempt: 1,
        ..ask(parts(Some("up"), vec![1]))
    };
    assert!(matches!(plan(&earlier, Some(&t), "rb3"), Ok(Plan::Sign { .. })));
}

#[test]
fn only_the_robot_an_attempt_ran_on_may_upload_its_outputs() {
    let t = task(2, "rb7", &[(1, "rb3")]);
    let refusal = plan(&ask(parts(None, vec![1])), Some(&t), "rb3").unwrap_err();
    assert!(!refusal.retry);
    assert!(refusal.reason.contains("did not run on robot rb3"), "{refusal:?}");
    let unknown = plan(&ask(parts(None, vec![1])), None, "rb7").unwrap_err();
    assert!(unknown.reason.contains("not known"), "{unknown:?}");
}

#[test]
fn a_path_out_of_the_task_directory_or_a_bad_size_is_refused() {
    let t = task(2, "rb7", &[]);
    for path in ["/etc/passwd", "../x", "out/../../x", "", "out//x", "a\nb", "./x"] {
        let bad = OutputAsk {
            path: path.into(),
            ..ask(parts(None, vec![1]))
        };
        assert!(plan(&bad, Some(&t), "rb7").is_err(), "{path:?}");
    }
    let tiny_parts = OutputAsk {
        size: 1 << 40,
        part_size: 1024,
        ..ask(parts(None, vec![1]))
    };
    assert!(plan(&tiny_parts, Some(&t), "rb7")
        .unwrap_err()
        .reason
        .contains("parts"));
    let no_sha = OutputAsk {
        sha256: "abc".into(),
        ..ask(parts(None, vec![1]))
    };
    assert!(plan(&no_sha, Some(&t), "rb7").is_err());
    // 20 MiB in 8 MiB parts: 3 parts.
    let beyond = plan(&ask(parts(Some("up"), vec![4])), Some(&t), "rb7").unwrap_err();
    assert!(beyond.reason.contains("parts 1 to 3"), "{beyond:?}");
    let short = plan(
        &ask(Want::Complete {
            upload_id: "up".into(),
            etags: vec!["a".into(), "b".into()],
        }),
        Some(&t),
        "rb7",
    )
    .unwrap_err();
    assert!(short.reason.contains("3 parts; 2 ETags"), "{short:?}");
}

#[test]
fn a_task_lists_at_most_its_share_of_outputs() {
    let mut t = task(2, "rb7", &[]);
    let listed: Vec<OutputStatus> = (0..MAX_OUTPUTS)
        .map(|i| OutputStatus {
            attempt: 2,
            path: format!("out/f{i}.bag"),
            state: OutputState::Uploaded,
            ..OutputStatus::default()
        })
        .collect();
    t.status.as_mut().unwrap().outputs = listed;
    let refusal = plan(&ask(parts(None, vec![1])), Some(&t), "rb7").unwrap_err();
    assert!(refusal.reason.contains("100 outputs"), "{refusal:?}");
    // One it lists already goes on.
    let again = OutputAsk {
        path: "out/f3.bag".into(),
        ..ask(parts(None, vec![1]))
    };
    assert!(plan(&again, Some(&t), "rb7").is_ok());
}

#[test]
fn an_output_replaces_its_own_entry_and_keeps_the_others() {
    let a = OutputStatus {
        attempt: 1,
        path: "a".into(),
        state: OutputState::Uploading,
        ..OutputStatus::default()
    };
    let b = OutputStatus {
        attempt: 1,
        path: "b".into(),
        ..a.clone()
    };
    let done = OutputStatus {
        state: OutputState::Uploaded,
        ..a.clone()
    };
    let list = with_output(&[a.clone(), b.clone()], done.clone()).unwrap();
    assert_eq!(list, vec![b.clone(), done.clone()]);
    // A late step of the upload (its start, recorded after the robot
    // dropped it) does not take an ended output back.
    let dropped = OutputStatus {
        state: OutputState::Dropped,
        ..a.clone()
    };
    assert_eq!(with_output(&[dropped], a.clone()), None);
    assert_eq!(with_output(&[done], a), None);
}

#[test]
fn a_path_no_output_of_the_template_names_is_refused() {
    let t = task(2, "rb7", &[]);
    let mut other = ask(parts(None, vec![1]));
    other.path = "secrets/token".into();
    let refused = plan(&other, Some(&t), "rb7").unwrap_err();
    assert!(refused.reason.contains("not named by the outputs"), "{refused:?}");
    assert!(!refused.retry);
    // `*` stops at a `/`.
    other.path = "out/deeper/run.bag".into();
    assert!(plan(&other, Some(&t), "rb7").is_err());
}

#[test]
fn a_file_the_task_lists_uploaded_is_not_sent_again() {
    let mut t = task(2, "rb7", &[]);
    t.status.as_mut().unwrap().outputs = vec![OutputStatus {
        attempt: 2,
        path: "out/run.bag".into(),
        sha256: SHA.into(),
        state: OutputState::Uploaded,
        ..OutputStatus::default()
    }];
    let again = plan(&ask(parts(None, vec![1, 2, 3])), Some(&t), "rb7").unwrap();
    assert_eq!(
        again,
        Plan::Uploaded {
            key: "default/survey/survey-scan-0/2/rb7/out/run.bag".into()
        }
    );
    // Another file under the name (its sha256 differs) is uploaded.
    let other = OutputAsk {
        sha256: "ab".repeat(32),
        ..ask(parts(None, vec![1]))
    };
    assert!(matches!(plan(&other, Some(&t), "rb7"), Ok(Plan::Begin { .. })));
}
