use super::*;
use k8s4r_api::{RobotSpec, RobotStatus};

fn robot(name: &str, phase: RobotPhase, labels: &[(&str, &str)]) -> Arc<Robot> {
    let mut r = Robot::new(name, RobotSpec::default());
    r.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect());
    r.status = Some(RobotStatus {
        phase: Some(phase),
        ..RobotStatus::default()
    });
    Arc::new(r)
}

fn recorded(r: &Robot) -> Option<Timestamp> {
    r.status.as_ref()?.last_heartbeat_time
}

#[test]
fn the_fleet_is_filtered_counted_and_paged() {
    let mut robots: Vec<Arc<Robot>> = (0..250)
        .map(|i| robot(&format!("r{i:03}"), RobotPhase::Online, &[("site", "lab")]))
        .collect();
    robots.push(robot("x1", RobotPhase::Offline, &[("site", "lab")]));
    robots.push(robot("y1", RobotPhase::Online, &[("site", "yard")]));
    let q = FleetQuery {
        selector: "site=lab".into(),
        page: 2,
        ..FleetQuery::default()
    };
    let page = select(robots.clone(), &q, recorded).unwrap();
    assert_eq!((page.total, page.rows.len()), (251, 51));
    assert_eq!((page.counts["Online"], page.counts["Offline"]), (250, 1));
    let offline = FleetQuery {
        phase: "Offline".into(),
        ..FleetQuery::default()
    };
    let page = select(robots.clone(), &offline, recorded).unwrap();
    assert_eq!(page.rows[0].name_any(), "x1");
    assert_eq!(page.counts["Online"], 251, "counts ignore the phase filter");
    assert!(select(
        robots,
        &FleetQuery {
            selector: "in (".into(),
            ..FleetQuery::default()
        },
        recorded
    )
    .is_err());
}

#[test]
fn query_values_are_encoded() {
    assert_eq!(url_encode("a b&c=d"), "a%20b%26c%3Dd");
}
