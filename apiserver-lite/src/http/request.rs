//! What a request asks for, read once from its method, path and query, in
//! the spirit of kube-apiserver's RequestInfo: the verb RBAC knows it by and
//! the group, version, resource, subresource, namespace and name its path
//! names. Nothing here looks at the store; whether the resource exists is
//! decided afterwards.

use std::fmt;

use axum::http::Method;

use super::Query;
use crate::authz::Attributes;
use crate::error::ApiError;
use crate::selectors::FieldSelector;

/// A request's verb, as RBAC rules name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// The verb of a method on a resource path; `None` for a method that
    /// means nothing there (a PUT on a collection). A POST to an object's
    /// subresource creates it (a ServiceAccount's `token`).
    fn of(method: &Method, named: bool, subresource: bool, watch: bool) -> Option<Verb> {
        Some(match (method.clone(), named) {
            (Method::GET, _) if watch => Verb::Watch,
            (Method::POST, true) if subresource => Verb::Create,
            (Method::GET, true) => Verb::Get,
            (Method::GET, false) => Verb::List,
            (Method::POST, false) => Verb::Create,
            (Method::PUT, true) => Verb::Update,
            (Method::PATCH, true) => Verb::Patch,
            (Method::DELETE, true) => Verb::Delete,
            (Method::DELETE, false) => Verb::DeleteCollection,
            _ => return None,
        })
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    /// `None` when the method means nothing on this path. It is answered
    /// 405 only once the path is known to name something, so that a path
    /// naming nothing is 404 whatever the method.
    pub verb: Option<Verb>,
    pub target: Target<'a>,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target<'a> {
    Discovery(Discovery<'a>),
    Resource(ResourcePath<'a>),
}

/// The discovery and OpenAPI documents, all read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery<'a> {
    /// `/`: the list of paths.
    Root,
    Version,
    /// `/api`: the versions of the core group.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/{group}`.
    Group(&'a str),
    /// `/api/{version}` (group `""`) or `/apis/{group}/{version}`.
    Resources {
        group: &'a str,
        version: &'a str,
    },
    OpenApiV2,
    OpenApiV3Root,
    /// `/openapi/v3/{path}`.
    OpenApiV3(String),
}

/// A path to a collection, an object or an object's subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath<'a> {
    pub group: &'a str,
    pub version: &'a str,
    /// The plural, e.g. `tasks`.
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    /// The namespace the path names; `None` for cluster-scoped paths
    /// (a Namespace object's own path among them).
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// For a list or a watch, the one name its field selector pins.
    pub pinned_name: Option<String>,
}

impl ResourcePath<'_> {
    /// The request in RBAC's terms.
    pub fn attributes(&self, verb: Verb) -> Attributes<'_> {
        let own_namespace = self.group.is_empty() && self.resource == "namespaces";
        Attributes {
            verb: verb.as_str(),
            group: self.group,
            resource: self.resource,
            subresource: self.subresource,
            // A namespace's own namespace is itself, for RoleBindings in it.
            namespace: if own_namespace { self.name } else { self.namespace },
            name: self.name.or(self.pinned_name.as_deref()),
        }
    }
}

/// Reads a request; a path that names nothing we serve is 404.
pub fn parse<'a>(method: &Method, path: &'a str, query: &Query) -> Result<RequestInfo<'a>, ApiError> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let Some(doc) = discovery(&segments) {
        return Ok(RequestInfo {
            verb: (method == Method::GET).then_some(Verb::Get),
            target: Target::Discovery(doc),
        });
    }
    let (watch_prefix, mut resource) = resource_path(&segments).ok_or_else(ApiError::no_route)?;
    let watch = watch_prefix || matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = Verb::of(
        method,
        resource.name.is_some(),
        resource.subresource.is_some(),
        watch,
    );
    // Only a list or a watch takes its name from the field selector.
    if matches!(verb, Some(Verb::List | Verb::Watch)) {
        resource.pinned_name = pinned_name(query);
    }
    Ok(RequestInfo {
        verb,
        target: Target::Resource(resource),
    })
}

fn discovery<'a>(segments: &[&'a str]) -> Option<Discovery<'a>> {
    Some(match segments {
        [] => Discovery::Root,
        ["version"] => Discovery::Version,
        ["api"] => Discovery::CoreVersions,
        ["apis"] => Discovery::Groups,
        ["api", version] => Discovery::Resources { group: "", version },
        ["apis", group] => Discovery::Group(group),
        ["apis", group, version] => Discovery::Resources { group, version },
        ["openapi", "v2"] => Discovery::OpenApiV2,
        ["openapi", "v3"] => Discovery::OpenApiV3Root,
        ["openapi", "v3", rest @ ..] => Discovery::OpenApiV3(rest.join("/")),
        _ => return None,
    })
}

/// A resource path, and whether it came under the `watch/` prefix.
fn resource_path<'a>(segments: &[&'a str]) -> Option<(bool, ResourcePath<'a>)> {
    let (group, version, rest) = match segments {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (watch, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let (namespace, resource, name, subresource) = match rest {
        // A Namespace's own subresources, which would otherwise read as a
        // collection called `status` in that namespace.
        ["namespaces", n, s @ ("status" | "finalize")] if group.is_empty() => {
            (None, "namespaces", Some(*n), Some(*s))
        }
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => return None,
    };
    let path = ResourcePath {
        group,
        version,
        resource,
        subresource,
        namespace,
        name,
        pinned_name: None,
    };
    Some((watch, path))
}

/// The one name a field selector pins (read as the list or watch will read
/// it), which RBAC's resourceNames can then allow.
fn pinned_name(query: &Query) -> Option<String> {
    let selector = FieldSelector::parse(query.get("fieldSelector")?, |_| true).ok()?;
    selector.pinned_name().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(method: Method, uri: &str) -> RequestInfo<'_> {
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let query: Query = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        parse(&method, path, &query).expect("parses")
    }

    fn resource<'a>(info: &'a RequestInfo<'_>) -> &'a ResourcePath<'a> {
        match &info.target {
            Target::Resource(r) => r,
            other => panic!("not a resource path: {other:?}"),
        }
    }

    #[test]
    fn paths_name_group_version_resource_namespace_and_name() {
        let info = parse_ok(
            Method::GET,
            "/apis/robot.k8s4r.io/v1/namespaces/default/tasks/t1/status",
        );
        assert_eq!(info.verb, Some(Verb::Get));
        assert_eq!(
            resource(&info),
            &ResourcePath {
                group: "robot.k8s4r.io",
                version: "v1",
                resource: "tasks",
                subresource: Some("status"),
                namespace: Some("default"),
                name: Some("t1"),
                pinned_name: None,
            }
        );
        let core = parse_ok(Method::GET, "//api/v1//configmaps/");
        assert_eq!(core.verb, Some(Verb::List));
        let core = resource(&core);
        assert_eq!(
            (core.group, core.resource, core.namespace),
            ("", "configmaps", None)
        );
    }

    #[test]
    fn methods_and_names_make_the_verb() {
        fn verb(method: Method, uri: &str) -> Option<Verb> {
            parse_ok(method, uri).verb
        }
        let list = "/api/v1/namespaces/default/configmaps";
        let one = "/api/v1/namespaces/default/configmaps/a";
        assert_eq!(verb(Method::GET, list), Some(Verb::List));
        assert_eq!(verb(Method::GET, one), Some(Verb::Get));
        assert_eq!(verb(Method::POST, list), Some(Verb::Create));
        assert_eq!(verb(Method::PUT, one), Some(Verb::Update));
        assert_eq!(verb(Method::PATCH, one), Some(Verb::Patch));
        assert_eq!(verb(Method::DELETE, one), Some(Verb::Delete));
        assert_eq!(verb(Method::DELETE, list), Some(Verb::DeleteCollection));
        assert_eq!(
            verb(Method::GET, "/api/v1/watch/namespaces/default/configmaps"),
            Some(Verb::Watch)
        );
        assert_eq!(verb(Method::GET, &format!("{one}?watch=1")), Some(Verb::Watch));
        assert_eq!(
            verb(Method::GET, &format!("{list}?watch=false")),
            Some(Verb::List)
        );
        // Left for later: the path may name nothing, which is 404 first.
        assert_eq!(verb(Method::PUT, list), None);
        assert_eq!(verb(Method::POST, one), None);
        assert_eq!(verb(Method::OPTIONS, one), None);
    }

    #[test]
    fn a_field_selector_pins_a_name_for_lists_and_watches_only() {
        let uri = "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name=pinned";
        let list = parse_ok(Method::GET, uri);
        assert_eq!(resource(&list).pinned_name.as_deref(), Some("pinned"));
        assert_eq!(resource(&list).attributes(Verb::List).name, Some("pinned"));
        let create = parse_ok(Method::POST, uri);
        assert_eq!(resource(&create).attributes(Verb::Create).name, None);
    }

    #[test]
    fn a_namespace_is_in_itself_for_rbac() {
        let info = parse_ok(Method::GET, "/api/v1/namespaces/kube-system/status");
        let path = resource(&info);
        assert_eq!(
            (path.resource, path.namespace, path.name),
            ("namespaces", None, Some("kube-system"))
        );
        assert_eq!(path.subresource, Some("status"));
        assert_eq!(path.attributes(Verb::Get).namespace, Some("kube-system"));
    }

    #[test]
    fn discovery_paths_are_read_only() {
        let version = parse_ok(Method::GET, "/version");
        assert_eq!(version.verb, Some(Verb::Get));
        assert_eq!(version.target, Target::Discovery(Discovery::Version));
        assert_eq!(parse_ok(Method::POST, "/version").verb, None);
        assert_eq!(
            parse_ok(Method::GET, "/apis/robot.k8s4r.io/v1").target,
            Target::Discovery(Discovery::Resources {
                group: "robot.k8s4r.io",
                version: "v1"
            })
        );
        assert_eq!(
            parse_ok(Method::GET, "/openapi/v3/apis/robot.k8s4r.io/v1").target,
            Target::Discovery(Discovery::OpenApiV3("apis/robot.k8s4r.io/v1".into()))
        );
    }

    #[test]
    fn paths_that_name_nothing_are_404() {
        for path in [
            "/x/y",
            "/api/v1/watch",
            "/api/v1/a/b/c/d",
            "/apis/g/v1/namespaces/ns/r/n/s/extra",
        ] {
            let err = parse(&Method::GET, path, &Query::new()).expect_err(path);
            assert_eq!(err.code, axum::http::StatusCode::NOT_FOUND, "{path}");
        }
    }
}
