use std::time::Duration;

use k8s4r_api::protocol::outputs::{Answer, PartUrl, Want};

use super::*;

const MIB: u64 = 1024 * 1024;
const PART: u64 = 8 * MIB;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn parts_answer(upload_id: &str, parts: &[u32], valid: Duration) -> Event {
    Event::Answer(Answer::Parts {
        key: "robots/rb1/k".into(),
        upload_id: upload_id.into(),
        urls: parts
            .iter()
            .map(|p| PartUrl {
                part: *p,
                url: format!("http://bucket/{upload_id}/{p}"),
            })
            .collect(),
        valid_ms: u64::try_from(valid.as_millis()).unwrap(),
    })
}

fn asked_parts(out: &[Do]) -> Option<(Option<String>, Vec<u32>)> {
    out.iter().find_map(|d| match d {
        Do::Ask(Want::Parts { upload_id, parts }) => Some((upload_id.clone(), parts.clone())),
        _ => None,
    })
}

fn sent(out: &[Do]) -> Option<(u32, u64, u64)> {
    out.iter().find_map(|d| match d {
        Do::Send {
            part, offset, len, ..
        } => Some((*part, *offset, *len)),
        _ => None,
    })
}

/// Drives an upload on from what it last said (`out`) to its end, with a
/// server that answers everything at once; the parts sent, in order.
fn drive(upload: &mut Upload, mut out: Vec<Do>, mut now: Duration) -> Vec<u32> {
    let mut sends = Vec::new();
    for _ in 0..1000 {
        now += Duration::from_millis(10);
        let next = if let Some((id, parts)) = asked_parts(&out) {
            parts_answer(id.as_deref().unwrap_or("up-1"), &parts, secs(900))
        } else if let Some((part, ..)) = sent(&out) {
            sends.push(part);
            Event::PartSent {
                part,
                etag: format!("\"e{part}\""),
            }
        } else if out.iter().any(|d| matches!(d, Do::Ask(Want::Complete { .. }))) {
            Event::Answer(Answer::Completed {
                key: "robots/rb1/k".into(),
            })
        } else {
            return sends;
        };
        out = upload.step(next, now);
    }
    panic!("the upload did not end")
}

#[test]
fn a_file_goes_part_by_part_and_is_completed_from_its_etags_in_order() {
    let size = 200 * MIB + 5;
    let mut upload = Upload::new(size, PART);
    let out = upload.step(Event::Start, secs(0));
    assert_eq!(asked_parts(&out), Some((None, (1..=8).collect())));
    // Nothing more is asked while the ask is out.
    assert!(upload.step(Event::Tick, secs(1)).is_empty());
    let out = upload.step(
        parts_answer("up-1", &[1, 2, 3, 4, 5, 6, 7, 8], secs(900)),
        secs(1),
    );
    assert_eq!(
        out[0],
        Do::Journal(Step::Begun {
            upload_id: "up-1".into(),
            key: "robots/rb1/k".into()
        }),
        "the upload's id is journaled before any part goes"
    );
    assert_eq!(sent(&out), Some((1, 0, PART)));
    let out = upload.step(
        Event::PartSent {
            part: 1,
            etag: "\"e1\"".into(),
        },
        secs(2),
    );
    assert_eq!(
        out[0],
        Do::Journal(Step::PartSent {
            part: 1,
            etag: "\"e1\"".into()
        })
    );
    assert_eq!(sent(&out), Some((2, PART, PART)));
    let sends = drive(&mut upload, out, secs(3));
    assert_eq!(sends, (2..=26).collect::<Vec<_>>(), "every part once, in order");
    assert_eq!(
        upload.phase(),
        &Phase::Done {
            key: "robots/rb1/k".into()
        }
    );
    assert_eq!(upload.confirmed_bytes(), size);
}

#[test]
fn the_completion_names_every_etag_in_part_order() {
    let mut upload = Upload::new(3 * PART, PART);
    upload.step(Event::Start, secs(0));
    upload.step(parts_answer("up-1", &[1, 2, 3], secs(900)), secs(0));
    for part in 1..=3 {
        let out = upload.step(
            Event::PartSent {
                part,
                etag: format!("e{part}"),
            },
            secs(1),
        );
        if part == 3 {
            assert!(out.contains(&Do::Ask(Want::Complete {
                upload_id: "up-1".into(),
                etags: vec!["e1".into(), "e2".into(), "e3".into()],
            })));
        }
    }
    assert_eq!(upload.phase(), &Phase::Completing);
    // No answer: asked again after ASK_AGAIN, not before.
    assert!(upload.step(Event::Tick, secs(1) + ASK_AGAIN / 2).is_empty());
    let out = upload.step(Event::Tick, secs(1) + ASK_AGAIN);
    assert!(matches!(out[..], [Do::Ask(Want::Complete { .. })]), "{out:?}");
}

#[test]
fn after_a_restart_confirmed_parts_are_never_sent_again() {
    let mut steps = vec![Step::Begun {
        upload_id: "up-1".into(),
        key: "robots/rb1/k".into(),
    }];
    steps.extend((1..=12).map(|part| Step::PartSent {
        part,
        etag: format!("e{part}"),
    }));
    let mut upload = Upload::resume(25 * PART, PART, &steps);
    assert_eq!(upload.confirmed_bytes(), 12 * PART);
    let out = upload.step(Event::Start, secs(0));
    assert_eq!(
        asked_parts(&out),
        Some((Some("up-1".into()), (13..=20).collect())),
        "the same upload, from its first missing part"
    );
    let sends = drive(&mut upload, out, secs(0));
    assert_eq!(sends, (13..=25).collect::<Vec<_>>());
}

#[test]
fn a_finished_or_dropped_upload_does_nothing_more() {
    let done = Upload::resume(PART, PART, &[Step::Completed { key: "k".into() }]);
    let mut dropped = Upload::resume(
        PART,
        PART,
        &[Step::Dropped {
            reason: "quota".into(),
        }],
    );
    for mut upload in [done, dropped.clone()] {
        assert!(upload.step(Event::Start, secs(0)).is_empty());
        assert!(upload.step(Event::Tick, secs(100)).is_empty());
    }
    assert!(dropped
        .step(parts_answer("up-1", &[1], secs(900)), secs(0))
        .is_empty());
}

#[test]
fn a_url_near_its_end_is_asked_for_again_not_used() {
    let mut upload = Upload::new(2 * PART, PART);
    upload.step(Event::Start, secs(0));
    upload.step(parts_answer("up-1", &[1, 2], secs(120)), secs(0));
    let out = upload.step(
        Event::PartSent {
            part: 1,
            etag: "e1".into(),
        },
        secs(100),
    );
    // Part 2's URL ends at 120 s: within the margin at 100 s.
    assert_eq!(sent(&out), None);
    assert_eq!(asked_parts(&out), Some((Some("up-1".into()), vec![2])));
}

#[test]
fn a_refused_url_is_asked_again_and_a_failed_part_waits_then_goes_again() {
    let mut upload = Upload::new(2 * PART, PART);
    upload.step(Event::Start, secs(0));
    upload.step(parts_answer("up-1", &[1, 2], secs(900)), secs(0));
    // The link failed: the same URL again, after a wait that grows.
    let out = upload.step(
        Event::PartFailed {
            part: 1,
            refused: false,
        },
        secs(1),
    );
    assert!(out.is_empty(), "{out:?}");
    assert!(upload.step(Event::Tick, secs(1) + FIRST_BACKOFF / 2).is_empty());
    let out = upload.step(Event::Tick, secs(1) + FIRST_BACKOFF);
    assert_eq!(sent(&out), Some((1, 0, PART)));
    let out = upload.step(
        Event::PartFailed {
            part: 1,
            refused: false,
        },
        secs(3),
    );
    assert!(out.is_empty());
    assert!(
        upload.step(Event::Tick, secs(3) + FIRST_BACKOFF).is_empty(),
        "the second wait is longer"
    );
    let out = upload.step(Event::Tick, secs(3) + FIRST_BACKOFF * 2);
    assert_eq!(sent(&out).map(|s| s.0), Some(1));
    // The bucket refused the URL: the part with a URL goes meanwhile,
    // and a new URL is asked for the other.
    upload.step(
        Event::PartFailed {
            part: 1,
            refused: true,
        },
        secs(10),
    );
    let out = upload.step(Event::Tick, secs(10) + MAX_BACKOFF);
    assert_eq!(sent(&out).map(|s| s.0), Some(2));
    let out = upload.step(
        Event::PartSent {
            part: 2,
            etag: "e2".into(),
        },
        secs(80),
    );
    assert_eq!(asked_parts(&out), Some((Some("up-1".into()), vec![1])));
}

#[test]
fn the_server_saying_no_for_good_gives_up_and_journals_why() {
    let mut upload = Upload::new(PART, PART);
    upload.step(Event::Start, secs(0));
    let out = upload.step(
        Event::Answer(Answer::Refused {
            reason: "no bucket is configured".into(),
            retry: false,
        }),
        secs(1),
    );
    assert_eq!(
        out,
        vec![
            Do::Journal(Step::Dropped {
                reason: "no bucket is configured".into()
            }),
            Do::GaveUp {
                reason: "no bucket is configured".into()
            },
        ]
    );
    // "Not now" waits and asks again.
    let mut upload = Upload::new(PART, PART);
    upload.step(Event::Start, secs(0));
    let out = upload.step(
        Event::Answer(Answer::Refused {
            reason: "the bucket is away".into(),
            retry: true,
        }),
        secs(1),
    );
    assert!(out.is_empty());
    let out = upload.step(Event::Tick, secs(1) + FIRST_BACKOFF);
    assert_eq!(asked_parts(&out), Some((None, vec![1])));
}

#[test]
fn an_answer_about_another_upload_is_not_used() {
    let mut upload = Upload::new(2 * PART, PART);
    upload.step(Event::Start, secs(0));
    upload.step(parts_answer("up-1", &[1], secs(900)), secs(0));
    upload.step(
        Event::PartSent {
            part: 1,
            etag: "e1".into(),
        },
        secs(1),
    );
    let out = upload.step(parts_answer("up-OLD", &[2], secs(900)), secs(1));
    assert_eq!(sent(&out), None, "{out:?}");
    // Nor URLs for parts that do not exist or were sent.
    let out = upload.step(parts_answer("up-1", &[1, 7], secs(900)), secs(2));
    assert_eq!(sent(&out), None, "{out:?}");
}

#[test]
fn an_empty_file_is_one_empty_part() {
    let mut upload = Upload::new(0, PART);
    let out = upload.step(Event::Start, secs(0));
    assert_eq!(asked_parts(&out), Some((None, vec![1])));
    let out = upload.step(parts_answer("up-1", &[1], secs(900)), secs(0));
    assert_eq!(sent(&out), Some((1, 0, 0)));
}
