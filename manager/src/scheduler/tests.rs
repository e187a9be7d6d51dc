use super::*;
use k8s4r_api::ConstraintOperator;

/// A builder for robots in tests: Online, exec driver, 4 CPUs, 8 GiB.
pub(crate) fn robot(name: &str) -> RobotFacts {
    RobotFacts {
        name: name.into(),
        phase: Some(RobotPhase::Online),
        drivers: vec!["exec".into(), "raw_exec".into()],
        cpu_milli: Some(4000),
        memory_bytes: Some(8 << 30),
        attributes: [("arch".to_string(), "x86_64".to_string())].into(),
        ..RobotFacts::default()
    }
}

impl RobotFacts {
    pub(crate) fn with_label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub(crate) fn with_phase(mut self, phase: RobotPhase) -> Self {
        self.phase = Some(phase);
        self
    }
    pub(crate) fn with_attr(mut self, k: &str, v: &str) -> Self {
        self.attributes.insert(k.into(), v.into());
        self
    }
}

fn request(group: &str) -> Request<'_> {
    Request {
        group,
        selector: None,
        constraints: &[],
        driver: "exec",
        demand: Demand::default(),
        avoid: None,
        robot: None,
        anti_affinity: None,
        affinity: &[],
        reserved: &[],
        when: &[],
        config: None,
    }
}

fn usage(cpu: u64, mem: u64, tasks: u32, group: &[(&str, u32)]) -> Usage {
    Usage {
        cpu_milli: cpu,
        memory_bytes: mem,
        disk_bytes: 0,
        tasks,
        per_group: group.iter().map(|(g, n)| (g.to_string(), *n)).collect(),
    }
}

#[test]
fn only_online_robots_are_candidates() {
    let req = request("g");
    assert_eq!(check(&robot("a"), &req, None), Ok(()));
    let off = robot("a").with_phase(RobotPhase::Offline);
    assert_eq!(check(&off, &req, None), Err(Rejection::Offline));
    let pending = robot("a").with_phase(RobotPhase::Pending);
    assert_eq!(check(&pending, &req, None), Err(Rejection::NotApproved));
    let rejected = robot("a").with_phase(RobotPhase::Rejected);
    assert_eq!(check(&rejected, &req, None), Err(Rejection::NotApproved));
    let mut unknown = robot("a");
    unknown.phase = None;
    assert_eq!(check(&unknown, &req, None), Err(Rejection::NotApproved));
}

#[test]
fn cordoned_robots_get_nothing() {
    let mut r = robot("a");
    r.unschedulable = true;
    assert_eq!(check(&r, &request("g"), None), Err(Rejection::Cordoned));
}

#[test]
fn selector_filters_by_labels() {
    let selector = LabelSelector::from_labels([("site", "lab")]);
    let req = Request {
        selector: Some(&selector),
        ..request("g")
    };
    assert_eq!(check(&robot("a").with_label("site", "lab"), &req, None), Ok(()));
    assert_eq!(
        check(&robot("a").with_label("site", "field"), &req, None),
        Err(Rejection::Selector)
    );
}

#[test]
fn a_selector_nobody_matches_names_the_closest_labels() {
    let robots = [
        robot("a").with_label("site", "lab"),
        robot("b").with_label("site", "field").with_label("zone", "north"),
    ];
    let typo = LabelSelector::from_labels([("sitee", "lab")]);
    let req = Request {
        selector: Some(&typo),
        ..request("g")
    };
    assert_eq!(
        choose(&robots, &req, |_| None).unwrap_err().to_string(),
        "0/2 robots: 2 don't match selector; no robot has label \"sitee\" (robots have \"site\")"
    );
    let value = LabelSelector::from_labels([("site", "labb")]);
    let req = Request {
        selector: Some(&value),
        ..request("g")
    };
    assert!(
        choose(&robots, &req, |_| None)
            .unwrap_err()
            .to_string()
            .ends_with("; no robot has site=labb (robots have site=lab)"),
        "the closest value"
    );
    let far = LabelSelector::from_labels([("site", "warehouse")]);
    let req = Request {
        selector: Some(&far),
        ..request("g")
    };
    assert!(
        choose(&robots, &req, |_| None)
            .unwrap_err()
            .to_string()
            .ends_with("; no robot has site=warehouse (robots have site=field|lab)"),
        "none close: the values robots have"
    );
    // Some robot matches (and is busy or offline): no hint.
    let fine = LabelSelector::from_labels([("zone", "north")]);
    let offline = [robot("a").with_label("site", "lab"), {
        let mut r = robot("b").with_label("zone", "north");
        r.phase = Some(RobotPhase::Offline);
        r
    }];
    let req = Request {
        selector: Some(&fine),
        ..request("g")
    };
    assert_eq!(
        choose(&offline, &req, |_| None).unwrap_err().to_string(),
        "0/2 robots: 1 offline, 1 don't match selector"
    );
}

#[test]
fn constraints_read_device_attributes_and_labels() {
    let constraints = [
        Constraint {
            attribute: "arch".into(),
            operator: ConstraintOperator::Equal,
            value: "aarch64".into(),
        },
        Constraint {
            attribute: "label.tier".into(),
            operator: ConstraintOperator::In,
            value: "gold,silver".into(),
        },
    ];
    let req = Request {
        constraints: &constraints,
        ..request("g")
    };
    let arm = robot("a").with_attr("arch", "aarch64");
    assert_eq!(
        check(&arm, &req, None),
        Err(Rejection::Constraint),
        "no tier label"
    );
    assert_eq!(check(&arm.clone().with_label("tier", "gold"), &req, None), Ok(()));
    let x86 = robot("b").with_label("tier", "gold");
    assert_eq!(check(&x86, &req, None), Err(Rejection::Constraint));
}

#[test]
fn driver_must_be_offered() {
    let mut r = robot("a");
    r.drivers = vec!["raw_exec".into()];
    assert_eq!(check(&r, &request("g"), None), Err(Rejection::Driver));
}

#[test]
fn robots_lacking_the_driver_are_told_with_the_agent_setting_that_offers_it() {
    let req = Request {
        driver: "raw_exec",
        ..request("g")
    };
    let exec_only = |name| {
        let mut r = robot(name);
        r.drivers = vec!["exec".into()];
        r
    };
    let robots = [
        exec_only("a"),
        exec_only("b"),
        robot("c").with_phase(RobotPhase::Offline),
    ];
    let err = choose(&robots, &req, |_| None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/3 robots: 1 offline, 2 lack driver raw_exec (agent setting raw_exec = true / --raw-exec true; \
         an agent running as root needs allow_root = true too)"
    );
}

#[test]
fn resources_must_fit_in_what_is_left() {
    let req = Request {
        demand: Demand {
            cpu_milli: 1000,
            memory_bytes: 1 << 30,
            ..Demand::default()
        },
        ..request("g")
    };
    let r = robot("a");
    assert_eq!(check(&r, &req, Some(&usage(3000, 0, 3, &[]))), Ok(()));
    assert_eq!(
        check(&r, &req, Some(&usage(3001, 0, 3, &[]))),
        Err(Rejection::Cpu)
    );
    assert_eq!(
        check(&r, &req, Some(&usage(0, 7 << 30 | 1, 3, &[]))),
        Err(Rejection::Memory)
    );
    let mut unlimited = robot("b");
    unlimited.cpu_milli = None;
    unlimited.memory_bytes = None;
    assert_eq!(
        check(&unlimited, &req, Some(&usage(99_000, 99 << 30, 99, &[]))),
        Ok(())
    );
}

#[test]
fn a_robot_that_takes_no_task_gets_none() {
    let mut r = robot("a");
    r.refusing = Some("DiskFull: the disk holding /var/lib/k8s4r is full".into());
    assert_eq!(check(&r, &request("g"), None), Err(Rejection::NotAccepting));
    let robots = [r, robot("b")];
    assert_eq!(choose(&robots, &request("g"), |_| None).unwrap().name, "b");
    let nofit = choose(&robots[..1], &request("g"), |_| None).unwrap_err();
    assert_eq!(nofit.to_string(), "0/1 robots: 1 not accepting tasks");
}

#[test]
fn the_task_limit_and_the_disk_budget_are_respected() {
    let mut r = robot("a");
    r.max_tasks = Some(2);
    r.disk_bytes = Some(100 << 20);
    let req = Request {
        demand: Demand {
            disk_bytes: 30 << 20,
            ..Demand::default()
        },
        ..request("g")
    };
    let mut used = usage(0, 0, 1, &[]);
    used.disk_bytes = 70 << 20;
    assert_eq!(check(&r, &req, Some(&used)), Ok(()));
    used.disk_bytes += 1;
    assert_eq!(check(&r, &req, Some(&used)), Err(Rejection::Disk));
    assert_eq!(
        check(&r, &req, Some(&usage(0, 0, 2, &[]))),
        Err(Rejection::TaskLimit)
    );
    r.max_tasks = None;
    r.disk_bytes = None;
    assert_eq!(check(&r, &req, Some(&usage(0, 0, 999, &[]))), Ok(()));
}

#[test]
fn the_robots_policy_filters_users_and_groups() {
    let mut r = robot("a");
    r.policy = Some(TaskPolicy {
        allowed_users: vec!["robot".into()],
        allowed_groups: vec!["dialout".into()],
        ..TaskPolicy::default()
    });
    let wants = |user: Option<&str>, groups: &[&str]| Request {
        demand: Demand {
            user: user.map(Into::into),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..Demand::default()
        },
        ..request("g")
    };
    assert_eq!(check(&r, &wants(None, &["dialout"]), None), Ok(()));
    assert_eq!(check(&r, &wants(Some("robot"), &[]), None), Ok(()));
    assert_eq!(check(&r, &wants(Some("root"), &[]), None), Err(Rejection::Policy));
    assert_eq!(check(&r, &wants(None, &["video"]), None), Err(Rejection::Policy));
    r.policy = None;
    assert_eq!(
        check(&r, &wants(Some("root"), &["video"]), None),
        Ok(()),
        "an agent that reports none"
    );
}

fn condition(text: &str) -> FactRequirement {
    let mut words = text.split(' ');
    let key = words.next().unwrap_or_default().to_owned();
    let operator = serde_json::from_value(serde_json::json!(words.next())).unwrap();
    FactRequirement {
        key,
        operator,
        values: words.map(str::to_owned).collect(),
        ..FactRequirement::default()
    }
}

impl RobotFacts {
    pub(crate) fn with_fact(mut self, name: &str, value: serde_json::Value) -> Self {
        self.facts
            .insert(name.into(), serde_json::from_value(value).unwrap());
        self
    }
}

#[test]
fn start_conditions_read_the_robots_facts() {
    let when = [condition("battery Gt 30"), condition("estop NotIn true")];
    let req = Request {
        when: &when,
        config: None,
        ..request("g")
    };
    let charged = robot("a").with_fact("battery", serde_json::json!(80));
    assert_eq!(check(&charged, &req, None), Ok(()));
    let low = robot("a").with_fact("battery", serde_json::json!(8));
    assert_eq!(check(&low, &req, None), Err(Rejection::Unmet(0)));
    assert_eq!(
        check(&robot("a"), &req, None),
        Err(Rejection::Unmet(0)),
        "no battery fact"
    );
    let stopped = charged.clone().with_fact("estop", serde_json::json!(true));
    assert_eq!(
        check(&stopped, &req, None),
        Err(Rejection::Unmet(1)),
        "the first unmet"
    );
    assert!(may_take_later(check(&low, &req, None)), "facts change");
    let cordoned = RobotFacts {
        unschedulable: true,
        ..low
    };
    assert_eq!(
        check(&cordoned, &req, None),
        Err(Rejection::Cordoned),
        "the lasting filters come first"
    );
}

#[test]
fn no_fit_names_the_condition_a_robot_does_not_meet() {
    let when = [condition("battery Gt 30"), condition("docked In true")];
    let req = Request {
        when: &when,
        config: None,
        ..request("g")
    };
    let robots = [
        robot("a").with_phase(RobotPhase::Offline),
        robot("b").with_fact("battery", serde_json::json!(10)),
        robot("c").with_fact("battery", serde_json::json!("12")),
    ];
    let err = choose(&robots, &req, |_| None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/3 robots: 1 offline, 2 don't meet battery Gt 30; no robot reports a fact named \"docked\""
    );
    let robots = [
        robot("b").with_fact("battery", serde_json::json!(10)),
        robot("c").with_fact("battery", serde_json::json!(90)),
    ];
    let err = choose(&robots, &req, |_| None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/2 robots: 1 don't meet battery Gt 30, 1 don't meet docked In [true]; no robot reports a fact named \"docked\""
    );
    let docked = robot("d")
        .with_fact("battery", serde_json::json!(90))
        .with_fact("docked", serde_json::json!(true));
    let robots = [robots[0].clone(), robots[1].clone(), docked];
    assert_eq!(choose(&robots, &req, |_| None).unwrap().name, "d");
}

#[test]
fn a_condition_on_a_fact_no_robot_reports_names_the_closest_one() {
    let when = [condition("batery Gt 30")];
    let req = Request {
        when: &when,
        config: None,
        ..request("g")
    };
    let robots = [
        robot("a").with_fact("battery", serde_json::json!(80)),
        robot("b")
            .with_fact("battery", serde_json::json!(90))
            .with_fact("docked", serde_json::json!(true)),
    ];
    let err = choose(&robots, &req, |_| None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/2 robots: 2 don't meet batery Gt 30; no robot reports a fact named \"batery\" (robots report \"battery\")"
    );
    // Nothing close: said without a guess.
    assert_eq!(closest("temperature", ["battery", "docked"]), None);
    assert_eq!(closest("dokced", ["battery", "docked"]), Some("docked"));
}

#[test]
fn a_change_of_facts_alone_wakes_only_tasks_it_lets_in() {
    let low = robot("a").with_fact("battery", serde_json::json!(10));
    let high = robot("a").with_fact("battery", serde_json::json!(80));
    assert_eq!(robot_change(Some(&low), &low.clone()), RobotChange::None);
    assert_eq!(robot_change(Some(&low), &high), RobotChange::Facts);
    assert_eq!(robot_change(None, &high), RobotChange::Other, "a new robot");
    let cordoned = RobotFacts {
        unschedulable: true,
        ..high.clone()
    };
    assert_eq!(robot_change(Some(&low), &cordoned), RobotChange::Other);

    let when = [condition("battery Gt 30")];
    let lower = robot("a").with_fact("battery", serde_json::json!(70));
    assert!(newly_met(&when, &low.facts, &high.facts));
    assert!(!newly_met(&when, &high.facts, &lower.facts), "met before too");
    assert!(!newly_met(&when, &high.facts, &low.facts), "no longer met");
    assert!(
        !newly_met(&[], &low.facts, &high.facts),
        "facts do not matter to it"
    );
}

#[test]
fn spreads_a_group_before_packing_by_load() {
    let robots = [robot("a"), robot("b")];
    let used: HashMap<String, Usage> = [
        ("a".to_string(), usage(0, 0, 1, &[("g", 1)])),
        ("b".to_string(), usage(3000, 0, 3, &[("other", 3)])),
    ]
    .into();
    let chosen = choose(&robots, &request("g"), |n| used.get(n)).unwrap();
    assert_eq!(
        chosen.name, "b",
        "b has no task of group g, even though it is busier"
    );
    let chosen = choose(&robots, &request("other"), |n| used.get(n)).unwrap();
    assert_eq!(chosen.name, "a");
}

#[test]
fn prefers_the_least_allocated_robot() {
    let robots = [robot("a"), robot("b"), robot("c")];
    let used: HashMap<String, Usage> = [
        ("a".to_string(), usage(2000, 0, 2, &[])),
        ("b".to_string(), usage(1000, 0, 1, &[])),
    ]
    .into();
    let req = Request {
        demand: Demand {
            cpu_milli: 500,
            ..Demand::default()
        },
        ..request("g")
    };
    assert_eq!(choose(&robots, &req, |n| used.get(n)).unwrap().name, "c");
    let robots = [robot("a"), robot("b")];
    assert_eq!(choose(&robots, &req, |n| used.get(n)).unwrap().name, "b");
}

fn fleet(n: usize) -> BTreeMap<String, RobotFacts> {
    (0..n)
        .map(|i| {
            let r = robot(&format!("r{i:02}"));
            (r.name.clone(), r)
        })
        .collect()
}

#[test]
fn a_sampled_choice_walks_a_fleet_of_equals_from_the_cursor() {
    let robots = fleet(40);
    let pick = |cursor: &str| {
        choose_sampled(&robots, cursor, &request("g"), |_| None)
            .unwrap()
            .name
            .clone()
    };
    assert_eq!(pick(""), "r00");
    assert_eq!(pick("r05"), "r06");
    assert_eq!(pick("r39"), "r00", "wraps round");
}

#[test]
fn a_sampled_choice_scores_only_the_first_robots_that_fit() {
    let robots = fleet(40);
    // r30 is the idlest robot, but 24 robots past the cursor.
    let used: HashMap<String, Usage> = robots
        .keys()
        .filter(|n| *n != "r30")
        .map(|n| (n.clone(), usage(1000, 0, 1, &[])))
        .collect();
    let sampled = choose_sampled(&robots, "r05", &request("g"), |n| used.get(n)).unwrap();
    assert_eq!(sampled.name, "r06", "r30 is not among the first {SAMPLE}");
    let near = choose_sampled(&robots, "r20", &request("g"), |n| used.get(n)).unwrap();
    assert_eq!(near.name, "r30", "within the sample the best still wins");
    let whole = choose(robots.values(), &request("g"), |n| used.get(n)).unwrap();
    assert_eq!(whole.name, "r30");
}

#[test]
fn a_sampled_choice_skips_what_does_not_fit_and_reports_the_whole_fleet() {
    let mut robots = fleet(40);
    for (i, r) in robots.values_mut().enumerate() {
        if i != 35 {
            r.phase = Some(RobotPhase::Offline);
        }
    }
    let chosen = choose_sampled(&robots, "r00", &request("g"), |_| None).unwrap();
    assert_eq!(chosen.name, "r35");
    robots.get_mut("r35").unwrap().phase = Some(RobotPhase::Offline);
    let nofit = choose_sampled(&robots, "r00", &request("g"), |_| None).unwrap_err();
    assert_eq!(nofit.total, 40);
    assert_eq!(nofit.rejections.get(&Rejection::Offline), Some(&40));
}

#[test]
fn a_preferred_affinity_or_a_pinned_robot_is_not_sampled() {
    let mut robots = fleet(40);
    robots.get_mut("r30").unwrap().labels = [("dock".to_string(), "yes".to_string())].into();
    let affinity = [WeightedAffinity {
        weight: 50,
        selector: LabelSelector::from_labels([("dock", "yes")]),
    }];
    let req = Request {
        affinity: &affinity,
        ..request("g")
    };
    assert_eq!(
        choose_sampled(&robots, "r00", &req, |_| None).unwrap().name,
        "r30"
    );
    let pinned = Request {
        robot: Some("r39"),
        ..request("g")
    };
    assert_eq!(
        choose_sampled(&robots, "r00", &pinned, |_| None).unwrap().name,
        "r39"
    );
}

#[test]
fn ties_break_by_task_count_then_name() {
    let robots = [robot("c"), robot("b"), robot("a")];
    let used: HashMap<String, Usage> = [("a".to_string(), usage(0, 0, 1, &[]))].into();
    assert_eq!(choose(&robots, &request("g"), |n| used.get(n)).unwrap().name, "b");
}

#[test]
fn the_avoided_robot_is_the_last_resort() {
    let robots = [robot("a"), robot("b")];
    let req = Request {
        avoid: Some("a"),
        ..request("g")
    };
    assert_eq!(choose(&robots, &req, |_| None).unwrap().name, "b");
    let only = [robot("a")];
    assert_eq!(choose(&only, &req, |_| None).unwrap().name, "a");
}

#[test]
fn no_fit_says_why_for_a_person() {
    let selector = LabelSelector::from_labels([("site", "lab")]);
    let req = Request {
        selector: Some(&selector),
        ..request("g")
    };
    let mut robots: Vec<RobotFacts> = (0..7)
        .map(|i| robot(&format!("off{i}")).with_phase(RobotPhase::Offline))
        .collect();
    robots.extend((0..5).map(|i| robot(&format!("on{i}"))));
    let err = choose(&robots, &req, |_| None).unwrap_err();
    assert_eq!(err.total, 12);
    assert_eq!(
        err.to_string(),
        "0/12 robots: 7 offline, 5 don't match selector; no robot has label \"site\""
    );
    let none: [RobotFacts; 0] = [];
    assert_eq!(
        choose(&none, &req, |_| None).unwrap_err().to_string(),
        "0/0 robots registered"
    );
}
#[test]
fn anti_affinity_keeps_one_task_of_a_group_per_robot() {
    let anti = AntiAffinity::default();
    let req = Request {
        anti_affinity: Some(&anti),
        ..request("g")
    };
    let robots = [robot("a"), robot("b")];
    let used: HashMap<String, Usage> = [("a".to_string(), usage(0, 0, 1, &[("g", 1)]))].into();
    assert_eq!(choose(&robots, &req, |n| used.get(n)).unwrap().name, "b");
    let used: HashMap<String, Usage> = [
        ("a".to_string(), usage(0, 0, 1, &[("g", 1)])),
        ("b".to_string(), usage(0, 0, 1, &[("g", 1)])),
    ]
    .into();
    let err = choose(&robots, &req, |n| used.get(n)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/2 robots: 2 already run a task of this group (anti-affinity)"
    );
    assert!(
        choose(&robots, &request("g"), |n| used.get(n)).is_ok(),
        "without the rule the group only spreads"
    );
}

#[test]
fn anti_affinity_by_label_keeps_one_task_per_value() {
    let anti = AntiAffinity {
        topology_key: Some("site".into()),
    };
    let req = Request {
        anti_affinity: Some(&anti),
        ..request("g")
    };
    let robots = [
        robot("a").with_label("site", "north"),
        robot("b").with_label("site", "north"),
        robot("c").with_label("site", "south"),
        robot("d"),
    ];
    let used: HashMap<String, Usage> = [("a".to_string(), usage(0, 0, 1, &[("g", 1)]))].into();
    assert_eq!(choose(&robots, &req, |n| used.get(n)).unwrap().name, "c");
    let used: HashMap<String, Usage> = [
        ("a".to_string(), usage(0, 0, 1, &[("g", 1)])),
        ("c".to_string(), usage(0, 0, 1, &[("g", 1)])),
    ]
    .into();
    let err = choose(&robots, &req, |n| used.get(n)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/4 robots: 1 lack label site (anti-affinity), \
         3 share their site with a task of this group (anti-affinity)"
    );
}

#[test]
fn preferred_affinity_outweighs_spread_and_load() {
    let rules = [
        WeightedAffinity {
            weight: 10,
            selector: LabelSelector::from_labels([("dock", "yes")]),
        },
        WeightedAffinity {
            weight: 50,
            selector: LabelSelector::from_labels([("lidar", "v2")]),
        },
    ];
    let req = Request {
        affinity: &rules,
        ..request("g")
    };
    let robots = [
        robot("a"),
        robot("b").with_label("dock", "yes"),
        robot("c").with_label("lidar", "v2"),
    ];
    let used: HashMap<String, Usage> = [("c".to_string(), usage(3000, 0, 3, &[("g", 2)]))].into();
    assert_eq!(choose(&robots, &req, |n| used.get(n)).unwrap().name, "c");
    assert_eq!(
        choose(&robots[..2], &req, |n| used.get(n)).unwrap().name,
        "b",
        "the lower weight still beats none"
    );
    assert_eq!(choose(&robots, &request("g"), |n| used.get(n)).unwrap().name, "a");
}

#[test]
fn a_pinned_task_looks_at_its_own_robot_only() {
    let req = Request {
        robot: Some("b"),
        ..request("g")
    };
    let robots = [robot("a"), robot("b").with_phase(RobotPhase::Offline)];
    let err = choose(&robots, &req, |_| None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/1 robots: 1 offline (the task runs only on robot b)"
    );
    let robots = [robot("a"), robot("b")];
    assert_eq!(choose(&robots, &req, |_| None).unwrap().name, "b");
    let req = Request {
        robot: Some("gone"),
        ..request("g")
    };
    assert_eq!(
        choose(&robots, &req, |_| None).unwrap_err().to_string(),
        "0/1 robots: robot gone (the task's own) is not registered"
    );
}

#[test]
fn a_robot_kept_for_higher_priority_is_skipped() {
    let reserved = ["a".to_string()];
    let req = Request {
        reserved: &reserved,
        ..request("g")
    };
    let robots = [robot("a"), robot("b")];
    assert_eq!(choose(&robots, &req, |_| None).unwrap().name, "b");
    assert_eq!(
        choose(&robots[..1], &req, |_| None).unwrap_err().to_string(),
        "0/1 robots: 1 kept for a waiting task of higher priority"
    );
}

#[test]
fn a_robot_a_waiting_task_of_higher_priority_fits_is_left_to_it() {
    let robots = fleet(3);
    let req = request("g");
    // r00 is chosen first (the cursor is past r02); "hi" wants it.
    let wanted = |robot: &str, already: &[&str]| (robot == "r00" && !already.contains(&"hi")).then_some("hi");
    let (chosen, outranked_by) = choose_outranked(&robots, "r02", &req, |_| None, wanted);
    assert_eq!(chosen.unwrap(), "r01");
    assert_eq!(outranked_by, ["hi"]);

    let (chosen, outranked_by) = choose_outranked(&robots, "r02", &req, |_| None, |_, _| None::<&str>);
    assert_eq!(chosen.unwrap(), "r00");
    assert!(outranked_by.is_empty());
}

#[test]
fn a_task_every_robot_is_left_to_finds_none_and_says_why() {
    let robots = fleet(1);
    let (chosen, outranked_by) =
        choose_outranked(&robots, "", &request("g"), |_| None, |_, _: &[&str]| Some("hi"));
    assert_eq!(
        chosen.unwrap_err().to_string(),
        "0/1 robots: 1 kept for a waiting task of higher priority"
    );
    assert_eq!(outranked_by, ["hi"]);
}

#[test]
fn at_most_max_reserved_robots_are_left_to_others() {
    let robots = fleet(MAX_RESERVED + 2);
    let names = ["a", "b", "c", "d", "e", "f"];
    let (chosen, outranked_by) = choose_outranked(
        &robots,
        "",
        &request("g"),
        |_| None,
        |_, already: &[&str]| Some(names[already.len()]),
    );
    assert!(chosen.is_ok());
    assert_eq!(outranked_by.len(), MAX_RESERVED);
}

/// A task's configuration that resolves on the robots named only.
#[derive(Debug)]
struct ConfigOn(&'static [&'static str]);

impl ConfigLookup for ConfigOn {
    fn problem(&self, robot: &str) -> Option<Problem> {
        (!self.0.contains(&robot)).then(|| Problem::NoKey {
            kind: k8s4r_api::config_ref::ObjectKind::ConfigMap,
            name: "calibration".into(),
            key: robot.into(),
        })
    }
}

#[test]
fn a_task_goes_only_where_its_configuration_resolves_and_waits_saying_what_is_missing() {
    let robots = [robot("a"), robot("b")];
    let only_b = ConfigOn(&["b"]);
    let req = Request {
        config: Some(&only_b),
        ..request("g")
    };
    assert_eq!(check(&robots[0], &req, None), Err(Rejection::Config));
    let chosen = choose(robots.iter(), &req, |_| None).map(|r| r.name.as_str());
    assert_eq!(chosen, Ok("b"));
    assert!(may_take_later(Err(Rejection::Config)));

    let nowhere = ConfigOn(&[]);
    let req = Request {
        config: Some(&nowhere),
        ..request("g")
    };
    let nofit = choose(robots.iter(), &req, |_| None).unwrap_err();
    assert_eq!(nofit.reason(), TaskReason::ConfigMissing);
    assert_eq!(
        nofit.to_string(),
        r#"0/2 robots: 2 lack the task's configuration; ConfigMap "calibration" has no key "a""#
    );
    // A robot refused for something else first says that instead.
    let offline = [robot("a").with_phase(RobotPhase::Offline)];
    let nofit = choose(offline.iter(), &req, |_| None).unwrap_err();
    assert_eq!(nofit.reason(), TaskReason::Unschedulable);
}
