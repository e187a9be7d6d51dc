use std::collections::BTreeMap;

use super::*;
use crate::config_ref::*;
use crate::task::EnvVar;

fn object(pairs: &[(&str, &str)]) -> Object<Vec<u8>> {
    Object {
        data: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect(),
        resource_version: "7".into(),
    }
}

fn from_cm(name: &str, key: &str, optional: Option<bool>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: String::new(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(KeySelector {
                name: "calibration".into(),
                key: key.into(),
                optional,
            }),
            secret_key_ref: None,
        }),
    }
}

struct World(BTreeMap<(ObjectKind, String), Object<Vec<u8>>>);

impl World {
    fn new() -> Self {
        let mut w = BTreeMap::new();
        w.insert(
            (ObjectKind::ConfigMap, "calibration".to_owned()),
            object(&[("rb1", "offset=3"), ("common", "x")]),
        );
        w.insert(
            (ObjectKind::Secret, "api".to_owned()),
            object(&[("token", "s3cr3t"), ("bad name", "y")]),
        );
        Self(w)
    }

    fn resolve(&self, t: &TaskTemplate, robot: &str) -> Result<Resolved<Vec<u8>>, Problem> {
        resolve(t, robot, |kind, name| self.0.get(&(kind, name.to_owned())))
    }
}

#[test]
fn a_per_robot_key_resolves_to_the_robots_own_value() {
    let t = TaskTemplate {
        env: vec![from_cm("CAL", "$(K8S4R_ROBOT_ID)", None)],
        ..TaskTemplate::default()
    };
    let r = World::new().resolve(&t, "rb1").unwrap();
    assert_eq!(r.env, vec![("CAL".to_owned(), b"offset=3".to_vec(), false)]);
    assert_eq!(
        r.sources,
        vec![crate::config_ref::ConfigSource {
            kind: ObjectKind::ConfigMap,
            name: "calibration".to_owned(),
            resource_version: "7".to_owned(),
        }]
    );
    assert_eq!(
        World::new().resolve(&t, "rb2").unwrap_err(),
        Problem::NoKey {
            kind: ObjectKind::ConfigMap,
            name: "calibration".into(),
            key: "rb2".into()
        }
    );
    assert_eq!(
        World::new().resolve(&t, "rb2").unwrap_err().to_string(),
        r#"ConfigMap "calibration" has no key "rb2""#
    );
}

#[test]
fn an_optional_reference_that_is_missing_sets_nothing() {
    let t = TaskTemplate {
        env: vec![from_cm("CAL", "nope", Some(true))],
        env_from: vec![EnvFromSource {
            prefix: None,
            config_map_ref: None,
            secret_ref: Some(ObjectSelector {
                name: "absent".into(),
                optional: Some(true),
            }),
        }],
        ..TaskTemplate::default()
    };
    let r = World::new().resolve(&t, "rb1").unwrap();
    assert!(r.env.is_empty());
}

#[test]
fn env_from_prefixes_keys_and_skips_those_that_are_not_names() {
    let t = TaskTemplate {
        env_from: vec![EnvFromSource {
            prefix: Some("API_".into()),
            config_map_ref: None,
            secret_ref: Some(ObjectSelector {
                name: "api".into(),
                optional: None,
            }),
        }],
        ..TaskTemplate::default()
    };
    let r = World::new().resolve(&t, "rb1").unwrap();
    // "API_bad name" has a space, which a variable name may hold: only '='
    // and NUL are refused.
    let names: Vec<_> = r.env.iter().map(|(n, _, s)| (n.as_str(), *s)).collect();
    assert_eq!(names, vec![("API_bad name", true), ("API_token", true)]);
}

#[test]
fn files_take_every_key_or_the_items_named_with_their_modes() {
    let t = TaskTemplate {
        files: vec![
            ConfigFiles {
                path: "conf/".into(),
                config_map: Some(ConfigMapFiles {
                    name: "calibration".into(),
                    ..ConfigMapFiles::default()
                }),
                secret: None,
            },
            ConfigFiles {
                path: "secrets".into(),
                config_map: None,
                secret: Some(SecretFiles {
                    secret_name: "api".into(),
                    items: vec![KeyToPath {
                        key: "token".into(),
                        path: "token.txt".into(),
                        mode: None,
                    }],
                    ..SecretFiles::default()
                }),
            },
        ],
        ..TaskTemplate::default()
    };
    let r = World::new().resolve(&t, "rb1").unwrap();
    let files: Vec<_> = r
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.mode, f.secret))
        .collect();
    assert_eq!(
        files,
        vec![
            ("conf/common", 0o644, false),
            ("conf/rb1", 0o644, false),
            ("secrets/token.txt", 0o400, true)
        ]
    );
    // Never a value in its Debug.
    assert!(!format!("{r:?}").contains("s3cr3t"));
}

#[test]
fn a_missing_object_is_named_and_too_much_is_refused_with_the_largest_named() {
    let t = TaskTemplate {
        files: vec![ConfigFiles {
            path: "maps".into(),
            config_map: Some(ConfigMapFiles {
                name: "map-$(K8S4R_ROBOT_ID)".into(),
                ..ConfigMapFiles::default()
            }),
            secret: None,
        }],
        ..TaskTemplate::default()
    };
    let mut w = World::new();
    assert_eq!(
        w.resolve(&t, "rb1").unwrap_err().to_string(),
        r#"ConfigMap "map-rb1" not found"#
    );
    let big = "x".repeat(MAX_TASK_CONFIG_BYTES);
    w.0.insert(
        (ObjectKind::ConfigMap, "map-rb1".into()),
        object(&[("grid", &big)]),
    );
    let err = w.resolve(&t, "rb1").unwrap_err();
    assert!(!err.is_missing());
    assert!(err.to_string().contains(r#"ConfigMap "map-rb1""#), "{err}");
}

#[test]
fn the_manager_resolves_by_sizes_alike() {
    let t = TaskTemplate {
        env: vec![from_cm("CAL", "$(K8S4R_ROBOT_ID)", None)],
        ..TaskTemplate::default()
    };
    let sizes = Object {
        data: BTreeMap::from([
            ("rb1".to_owned(), KeyInfo::of(b"offset=3")),
            ("rb2".to_owned(), KeyInfo::of(b"\xff\x00")),
        ]),
        resource_version: "1".into(),
    };
    let r = resolve(&t, "rb1", |_, _| Some(&sizes)).unwrap();
    assert_eq!(r.bytes(), 3 + 8);
    assert!(resolve(&t, "rb3", |_, _| Some(&sizes)).is_err());
    // A value that is not text cannot be a variable: refused, not waited
    // for, by the manager as by the server.
    let err = resolve(&t, "rb2", |_, _| Some(&sizes)).unwrap_err();
    assert_eq!(err.reason(), crate::task::TaskReason::ConfigInvalid);
    assert!(err.to_string().contains("not text"), "{err}");
    let bytes = Object {
        data: BTreeMap::from([("rb2".to_owned(), b"\xff\x00".to_vec())]),
        resource_version: "1".into(),
    };
    assert_eq!(resolve(&t, "rb2", |_, _| Some(&bytes)).unwrap_err(), err);
}
