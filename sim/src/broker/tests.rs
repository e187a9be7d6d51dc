use super::*;

fn msg(topic: &str, payload: &str, qos: u8, retain: bool) -> Message {
    Message {
        topic: topic.into(),
        payload: payload.as_bytes().to_vec(),
        qos,
        retain,
    }
}

fn connect(b: &mut Broker, client: &str, clean: bool) -> Vec<Output> {
    b.handle(Input::Connect {
        client: client.into(),
        clean_session: clean,
        will: None,
    })
}

fn subscribe(b: &mut Broker, client: &str, filter: &str) -> Vec<Output> {
    b.handle(Input::Subscribe {
        client: client.into(),
        filter: filter.into(),
        qos: 1,
    })
}

fn publish(b: &mut Broker, from: &str, message: Message) -> Vec<Output> {
    b.handle(Input::Publish {
        client: from.into(),
        message,
    })
}

/// (client, payload, dup) of each delivery.
fn delivered(out: &[Output]) -> Vec<(String, String, bool)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Deliver {
                client, message, dup, ..
            } => Some((
                client.clone(),
                String::from_utf8_lossy(&message.payload).into_owned(),
                *dup,
            )),
            _ => None,
        })
        .collect()
}

fn packet_ids(out: &[Output]) -> Vec<u16> {
    out.iter()
        .filter_map(|o| match o {
            Output::Deliver { packet_id, .. } => Some(*packet_id),
            _ => None,
        })
        .collect()
}

#[test]
fn filters_match_as_mqtt_says() {
    assert!(matches("k8s4r/robots/+/heartbeat", "k8s4r/robots/rb1/heartbeat"));
    assert!(!matches(
        "k8s4r/robots/+/heartbeat",
        "k8s4r/robots/rb1/x/heartbeat"
    ));
    assert!(matches("k8s4r/robots/rb1/#", "k8s4r/robots/rb1/tasks/u/status"));
    assert!(
        matches("k8s4r/robots/rb1/#", "k8s4r/robots/rb1"),
        "# includes the parent level"
    );
    assert!(!matches("k8s4r/robots/rb1", "k8s4r/robots/rb1/x"));
    assert!(
        !matches("#", "$SYS/broker/uptime"),
        "$-topics need their first level named"
    );
    assert!(matches("$SYS/#", "$SYS/broker/uptime"));
}

#[test]
fn an_unacknowledged_delivery_comes_again_marked_dup_after_a_reconnect() {
    let mut b = Broker::default();
    connect(&mut b, "rb1", false);
    subscribe(&mut b, "rb1", "k8s4r/robots/rb1/tasks/dispatch");
    connect(&mut b, "server", true);
    let out = publish(
        &mut b,
        "server",
        msg("k8s4r/robots/rb1/tasks/dispatch", "n", 1, false),
    );
    assert_eq!(delivered(&out), [("rb1".into(), "n".into(), false)]);
    // The PUBACK is lost with the link; the agent restarts and resumes.
    b.handle(Input::Disconnect {
        client: "rb1".into(),
        graceful: false,
    });
    let again = connect(&mut b, "rb1", false);
    assert_eq!(
        again[0],
        Output::ConnAck {
            client: "rb1".into(),
            session_present: true
        }
    );
    assert_eq!(delivered(&again), [("rb1".into(), "n".into(), true)]);
    assert_eq!(packet_ids(&again), packet_ids(&out), "the same packet id");
    // Acknowledged now: never again.
    b.handle(Input::Ack {
        client: "rb1".into(),
        packet_id: packet_ids(&again)[0],
    });
    b.handle(Input::Disconnect {
        client: "rb1".into(),
        graceful: true,
    });
    assert!(delivered(&connect(&mut b, "rb1", false)).is_empty());
}

#[test]
fn a_persistent_session_queues_qos1_in_order_and_drops_qos0_while_away() {
    let mut b = Broker::default();
    connect(&mut b, "rb1", false);
    subscribe(&mut b, "rb1", "t/#");
    b.handle(Input::Disconnect {
        client: "rb1".into(),
        graceful: true,
    });
    connect(&mut b, "s", true);
    for (payload, qos) in [("1", 1), ("x", 0), ("2", 1), ("3", 1)] {
        assert!(publish(&mut b, "s", msg("t/a", payload, qos, false)).is_empty());
    }
    assert_eq!(b.pending("rb1"), 3);
    let out = connect(&mut b, "rb1", false);
    let payloads: Vec<String> = delivered(&out).into_iter().map(|(_, p, _)| p).collect();
    assert_eq!(payloads, ["1", "2", "3"]);
}

#[test]
fn a_clean_session_forgets_everything() {
    let mut b = Broker::default();
    connect(&mut b, "rb1", true);
    subscribe(&mut b, "rb1", "t");
    connect(&mut b, "s", true);
    publish(&mut b, "s", msg("t", "1", 1, false));
    b.handle(Input::Disconnect {
        client: "rb1".into(),
        graceful: false,
    });
    publish(&mut b, "s", msg("t", "2", 1, false));
    let out = connect(&mut b, "rb1", true);
    assert_eq!(
        out,
        [Output::ConnAck {
            client: "rb1".into(),
            session_present: false
        }]
    );
    // Not subscribed any more either.
    assert!(publish(&mut b, "s", msg("t", "3", 1, false)).is_empty());
}

#[test]
fn retained_messages_greet_new_subscriptions_and_an_empty_one_clears() {
    let mut b = Broker::default();
    connect(&mut b, "rb1", true);
    publish(&mut b, "rb1", msg("k8s4r/robots/rb1/online", "true", 1, true));
    connect(&mut b, "server", true);
    let out = subscribe(&mut b, "server", "k8s4r/robots/+/online");
    assert_eq!(delivered(&out), [("server".into(), "true".into(), false)]);
    publish(&mut b, "rb1", msg("k8s4r/robots/rb1/online", "", 1, true));
    connect(&mut b, "other", true);
    assert!(delivered(&subscribe(&mut b, "other", "k8s4r/robots/+/online")).is_empty());
}

#[test]
fn the_will_is_published_on_a_cut_not_on_a_disconnect_and_on_a_takeover() {
    let will = msg("k8s4r/robots/rb1/online", "false", 1, true);
    let mut b = Broker::default();
    connect(&mut b, "server", true);
    subscribe(&mut b, "server", "k8s4r/robots/+/online");
    let with_will = |b: &mut Broker| {
        b.handle(Input::Connect {
            client: "rb1".into(),
            clean_session: false,
            will: Some(will.clone()),
        })
    };
    with_will(&mut b);
    let out = b.handle(Input::Disconnect {
        client: "rb1".into(),
        graceful: true,
    });
    assert!(out.is_empty());
    with_will(&mut b);
    let out = b.handle(Input::Disconnect {
        client: "rb1".into(),
        graceful: false,
    });
    assert_eq!(delivered(&out), [("server".into(), "false".into(), false)]);
    // A second connection with the same id closes the first: its will goes
    // out before the new connection's CONNACK.
    with_will(&mut b);
    let out = with_will(&mut b);
    assert_eq!(out[0], Output::Closed { client: "rb1".into() });
    assert_eq!(delivered(&out), [("server".into(), "false".into(), false)]);
    assert!(matches!(
        out.last(),
        Some(Output::ConnAck {
            session_present: true,
            ..
        })
    ));
}

#[test]
fn a_shared_subscription_gives_each_message_to_one_connected_member_in_turn() {
    let mut b = Broker::default();
    for server in ["s1", "s2"] {
        connect(&mut b, server, true);
        subscribe(&mut b, server, "$share/servers/k8s4r/robots/+/heartbeat");
    }
    connect(&mut b, "rb1", true);
    let mut to = Vec::new();
    for i in 0..4 {
        let out = publish(
            &mut b,
            "rb1",
            msg("k8s4r/robots/rb1/heartbeat", &i.to_string(), 0, false),
        );
        let d = delivered(&out);
        assert_eq!(d.len(), 1, "one member each time");
        to.push(d[0].0.clone());
    }
    assert_eq!(to, ["s1", "s2", "s1", "s2"]);
    b.handle(Input::Disconnect {
        client: "s1".into(),
        graceful: false,
    });
    for _ in 0..2 {
        let out = publish(&mut b, "rb1", msg("k8s4r/robots/rb1/heartbeat", "x", 0, false));
        assert_eq!(delivered(&out)[0].0, "s2");
    }
}

#[test]
fn a_subscriber_gets_one_copy_at_its_best_qos_and_packet_ids_are_not_reused_in_flight() {
    let mut b = Broker::default();
    connect(&mut b, "c", true);
    b.handle(Input::Subscribe {
        client: "c".into(),
        filter: "a/#".into(),
        qos: 0,
    });
    subscribe(&mut b, "c", "a/b");
    connect(&mut b, "s", true);
    let out = publish(&mut b, "s", msg("a/b", "x", 1, false));
    assert_eq!(delivered(&out).len(), 1);
    assert!(matches!(&out[0], Output::Deliver { message, .. } if message.qos == 1));
    let mut ids: Vec<u16> = Vec::new();
    for _ in 0..10 {
        ids.extend(packet_ids(&publish(&mut b, "s", msg("a/b", "x", 1, false))));
    }
    ids.extend(packet_ids(&out));
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 11, "distinct while in flight");
}

#[test]
fn a_restart_keeps_what_was_saved_and_loses_what_came_after() {
    let mut b = Broker::default();
    connect(&mut b, "rb1", false);
    subscribe(&mut b, "rb1", "t/#");
    connect(&mut b, "once", true);
    subscribe(&mut b, "once", "t/#");
    connect(&mut b, "s", true);
    // In flight to rb1 (no PUBACK yet), and a retained message.
    publish(&mut b, "s", msg("t/a", "1", 1, false));
    publish(&mut b, "s", msg("r/x", "kept", 1, true));
    let saved = b.clone();
    publish(&mut b, "s", msg("t/a", "2", 1, false));

    // A crash: what came after the last save is gone.
    let mut after = Broker::restarted(&saved);
    assert!(!after.is_connected("rb1") && !after.is_connected("s"));
    let out = connect(&mut after, "rb1", false);
    assert_eq!(
        out[0],
        Output::ConnAck {
            client: "rb1".into(),
            session_present: true
        }
    );
    assert_eq!(delivered(&out), [("rb1".into(), "1".into(), true)]);
    // The subscription came back with the session; the clean one did not.
    assert_eq!(
        delivered(&publish(&mut after, "rb1", msg("t/b", "3", 1, false))),
        [("rb1".into(), "3".into(), false)]
    );
    assert_eq!(
        connect(&mut after, "once", false)[0],
        Output::ConnAck {
            client: "once".into(),
            session_present: false
        }
    );
    connect(&mut after, "other", true);
    assert_eq!(
        delivered(&subscribe(&mut after, "other", "r/#")),
        [("other".into(), "kept".into(), false)],
        "retained messages are kept"
    );

    // A clean stop saves everything first.
    let mut clean = Broker::restarted(&b);
    assert_eq!(
        delivered(&connect(&mut clean, "rb1", false)),
        [("rb1".into(), "1".into(), true), ("rb1".into(), "2".into(), true)]
    );
}
