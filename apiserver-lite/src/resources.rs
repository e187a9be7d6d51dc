//! The resource types the server serves: a few built-ins, and whatever a
//! CustomResourceDefinition registers at run time.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::FieldError;
use crate::metadata::meta_str;

/// Where CRDs are stored, as the store names group-resources.
pub const CRD_RESOURCE: &str = "customresourcedefinitions.apiextensions.k8s.io";

/// A column of `kubectl get` output, as in a CRD's `additionalPrinterColumns`.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// One served group/version/resource.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status_subresource: bool,
    pub columns: Vec<PrinterColumn>,
    /// The openAPIV3Schema of a custom resource; `None` for built-ins.
    pub schema: Option<Value>,
    /// Whether this is a custom resource (strategic merge patch is refused, schema applies).
    pub custom: bool,
    /// Whether the version is the storage version (discovery's preferred one).
    pub storage: bool,
    /// How objects are converted between this type and the form they are stored in.
    pub conversion: Conversion,
    /// A review (SelfSubjectAccessReview and the like): only created,
    /// answered at once and never stored.
    pub review: bool,
}

/// How a resource type's objects relate to the form they are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Stored as served (another version of a CRD differs in apiVersion only).
    None,
    /// core/v1 Events, stored as events.k8s.io/v1 Events (see [`crate::event_conversion`]).
    CoreEvent,
}

impl ResourceType {
    /// Where the objects are stored: the group-resource shared by all
    /// versions of a resource, and by both Event APIs.
    pub fn stored_resource(&self) -> String {
        match self.conversion {
            Conversion::None => self.group_resource(),
            Conversion::CoreEvent => crate::event_conversion::STORED_RESOURCE.to_string(),
        }
    }

    /// `plural.group` (`plural` for the core group), as messages name it.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The apiVersion of this type's objects as stored.
    pub fn stored_api_version(&self) -> String {
        match self.conversion {
            Conversion::None => self.api_version(),
            Conversion::CoreEvent => crate::event_conversion::STORED_API_VERSION.to_string(),
        }
    }

    /// A stored object in this type's form (its apiVersion aside).
    pub fn from_storage<'a>(&self, stored: &'a Value) -> Cow<'a, Value> {
        match self.conversion {
            Conversion::None => Cow::Borrowed(stored),
            Conversion::CoreEvent => Cow::Owned(crate::event_conversion::to_core(stored)),
        }
    }

    /// An object sent to this type, in the form it is stored in.
    pub fn to_storage(&self, served: Value) -> Value {
        match self.conversion {
            Conversion::None => served,
            Conversion::CoreEvent => crate::event_conversion::from_core(&served),
        }
    }

    pub fn is_crd(&self) -> bool {
        self.group == "apiextensions.k8s.io" && self.plural == "customresourcedefinitions"
    }

    pub fn is_service_accounts(&self) -> bool {
        self.group.is_empty() && self.plural == "serviceaccounts"
    }

    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    /// Verbs as discovery lists them.
    pub fn verbs(&self) -> Vec<&'static str> {
        if self.review {
            return vec!["create"];
        }
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs(),
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut out = vec![main];
        if self.status_subresource {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.is_service_accounts() {
            out.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
        out
    }
}

fn age_column() -> PrinterColumn {
    PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description:
            "CreationTimestamp is a timestamp representing the server time when this object was created."
                .into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }
}

fn column(name: &str, type_: &str, path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: String::new(),
        priority: 0,
        json_path: path.into(),
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    /// The categories a real server puts the kind in (`kubectl get all`
    /// expands `all` from discovery).
    categories: &'static [&'static str],
    status: bool,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        categories: &[],
        status: true,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        categories: &["all"],
        status: true,
    },
    Builtin {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        short_names: &["deploy"],
        categories: &["all"],
        status: true,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        short_names: &[],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        short_names: &[],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        short_names: &[],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short_names: &[],
        categories: &[],
        status: false,
    },
    Builtin {
        group: "apiregistration.k8s.io",
        version: "v1",
        plural: "apiservices",
        singular: "apiservice",
        kind: "APIService",
        namespaced: false,
        short_names: &[],
        categories: &["api-extensions"],
        status: true,
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingwebhookconfigurations",
        singular: "validatingwebhookconfiguration",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
        short_names: &[],
        categories: &["api-extensions"],
        status: false,
    },
    // API Priority and Fairness: stored so that deploy/ applies, never
    // enforced (this server has no flow control; KNOWN_DIFFERENCES).
    Builtin {
        group: "flowcontrol.apiserver.k8s.io",
        version: "v1",
        plural: "flowschemas",
        singular: "flowschema",
        kind: "FlowSchema",
        namespaced: false,
        short_names: &[],
        categories: &[],
        status: true,
    },
    Builtin {
        group: "flowcontrol.apiserver.k8s.io",
        version: "v1",
        plural: "prioritylevelconfigurations",
        singular: "prioritylevelconfiguration",
        kind: "PriorityLevelConfiguration",
        namespaced: false,
        short_names: &[],
        categories: &[],
        status: true,
    },
    Builtin {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        namespaced: false,
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        status: true,
    },
];

/// The reviews served: group, version, plural, kind. authentication.k8s.io
/// v1beta1 is still served by 1.32 servers, and is the one kubectl 1.27's
/// `auth whoami` asks.
const REVIEWS: &[(&str, &str, &str, &str)] = &[
    (
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
    ),
    (
        "authentication.k8s.io",
        "v1beta1",
        "selfsubjectreviews",
        "SelfSubjectReview",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
    ),
];

fn reviews() -> impl Iterator<Item = ResourceType> {
    REVIEWS
        .iter()
        .map(|&(group, version, plural, kind)| ResourceType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            namespaced: false,
            short_names: Vec::new(),
            categories: Vec::new(),
            status_subresource: false,
            columns: Vec::new(),
            schema: None,
            custom: false,
            // The preferred version of its group.
            storage: version == "v1",
            conversion: Conversion::None,
            review: true,
        })
}

pub fn builtins() -> Vec<ResourceType> {
    BUILTINS
        .iter()
        .map(|b| {
            let columns = match (b.group, b.plural) {
                ("", "namespaces") => vec![column("Status", "string", ".status.phase"), age_column()],
                ("", "secrets") => vec![column("Type", "string", ".type"), age_column()],
                ("", "events") => vec![
                    column("Type", "string", ".type"),
                    column("Reason", "string", ".reason"),
                    column("Object", "string", ".involvedObject.name"),
                    column("Message", "string", ".message"),
                ],
                ("events.k8s.io", "events") => vec![
                    column("Type", "string", ".type"),
                    column("Reason", "string", ".reason"),
                    column("Object", "string", ".regarding.name"),
                    column("Message", "string", ".note"),
                ],
                ("coordination.k8s.io", "leases") => {
                    vec![column("Holder", "string", ".spec.holderIdentity"), age_column()]
                }
                // A real server's columns but its FlowSchemas' MissingPL,
                // which reads a condition only its APF controller sets.
                ("flowcontrol.apiserver.k8s.io", "flowschemas") => vec![
                    column("PriorityLevel", "string", ".spec.priorityLevelConfiguration.name"),
                    column("MatchingPrecedence", "integer", ".spec.matchingPrecedence"),
                    column("DistinguisherMethod", "string", ".spec.distinguisherMethod.type"),
                    age_column(),
                ],
                ("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations") => vec![
                    column("Type", "string", ".spec.type"),
                    column(
                        "NominalConcurrencyShares",
                        "integer",
                        ".spec.limited.nominalConcurrencyShares",
                    ),
                    column("Queues", "integer", ".spec.limited.limitResponse.queuing.queues"),
                    column(
                        "HandSize",
                        "integer",
                        ".spec.limited.limitResponse.queuing.handSize",
                    ),
                    column(
                        "QueueLengthLimit",
                        "integer",
                        ".spec.limited.limitResponse.queuing.queueLengthLimit",
                    ),
                    age_column(),
                ],
                ("apiextensions.k8s.io", _) => {
                    vec![column("Created At", "string", ".metadata.creationTimestamp")]
                }
                _ => vec![age_column()],
            };
            let conversion = match (b.group, b.plural) {
                ("", "events") => Conversion::CoreEvent,
                _ => Conversion::None,
            };
            ResourceType {
                group: b.group.into(),
                version: b.version.into(),
                plural: b.plural.into(),
                singular: b.singular.into(),
                kind: b.kind.into(),
                list_kind: format!("{}List", b.kind),
                namespaced: b.namespaced,
                short_names: b.short_names.iter().map(|s| s.to_string()).collect(),
                categories: b.categories.iter().map(|s| s.to_string()).collect(),
                status_subresource: b.status,
                columns,
                schema: None,
                custom: false,
                // core/v1 Events are a view of events.k8s.io/v1, which stores them.
                storage: conversion == Conversion::None,
                conversion,
                review: false,
            }
        })
        .chain(reviews())
        .collect()
}

/// Reads the resource types a CRD object declares, or the field errors that make it invalid.
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceType>, Vec<FieldError>> {
    let mut errors = Vec::new();
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    if group.is_empty() {
        errors.push(FieldError::required("spec.group"));
    }
    if plural.is_empty() {
        errors.push(FieldError::required("spec.names.plural"));
    }
    if kind.is_empty() {
        errors.push(FieldError::required("spec.names.kind"));
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let expected = format!("{plural}.{group}");
    if !plural.is_empty() && !group.is_empty() && name != expected {
        errors.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = spec["scope"].as_str().unwrap_or_default();
    if scope != "Namespaced" && scope != "Cluster" {
        errors.push(FieldError::not_supported(
            "spec.scope",
            &json!(scope),
            &[json!("Cluster"), json!("Namespaced")],
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        errors.push(FieldError::required("spec.versions"));
    }
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let vname = v["name"].as_str().unwrap_or_default();
        if vname.is_empty() {
            errors.push(FieldError::required(&format!("spec.versions[{i}].name")));
            continue;
        }
        if !v["served"].as_bool().unwrap_or(false) {
            continue;
        }
        let columns = match v["additionalPrinterColumns"].as_array() {
            Some(cols) => cols
                .iter()
                .map(|c| PrinterColumn {
                    name: c["name"].as_str().unwrap_or_default().into(),
                    type_: c["type"].as_str().unwrap_or("string").into(),
                    format: c["format"].as_str().unwrap_or_default().into(),
                    description: c["description"].as_str().unwrap_or_default().into(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                    json_path: c["jsonPath"].as_str().unwrap_or_default().into(),
                })
                .collect(),
            None => vec![age_column()],
        };
        let schema = v["schema"]["openAPIV3Schema"].clone();
        out.push(ResourceType {
            group: group.clone(),
            version: vname.into(),
            plural: plural.clone(),
            singular: names["singular"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| kind.to_lowercase()),
            kind: kind.clone(),
            list_kind: names["listKind"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| format!("{kind}List")),
            namespaced: scope == "Namespaced",
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status_subresource: v["subresources"]["status"].is_object(),
            columns,
            schema: if schema.is_object() { Some(schema) } else { None },
            custom: true,
            storage: v["storage"].as_bool().unwrap_or(false),
            conversion: Conversion::None,
            review: false,
        });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The set of served resource types, looked up by group/version/plural.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_gvr: HashMap<(String, String, String), Arc<ResourceType>>,
    /// Which CRD (by name) registered which group-resource.
    crd_of: HashMap<String, String>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut reg = Registry::default();
        for rt in builtins() {
            reg.insert(rt);
        }
        reg
    }

    fn insert(&mut self, rt: ResourceType) {
        self.by_gvr.insert(
            (rt.group.clone(), rt.version.clone(), rt.plural.clone()),
            Arc::new(rt),
        );
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_gvr
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Any served type stored under `gr` (see [`ResourceType::stored_resource`]), storage version first.
    pub fn by_group_resource(&self, gr: &str) -> Option<Arc<ResourceType>> {
        let mut best: Option<Arc<ResourceType>> = None;
        for rt in self.by_gvr.values() {
            if rt.stored_resource() == gr && (best.is_none() || rt.storage) {
                best = Some(rt.clone());
            }
        }
        best
    }

    /// Replaces whatever the CRD named `crd_name` registered before.
    pub fn register_crd(&mut self, crd_name: &str, types: Vec<ResourceType>) {
        self.unregister_crd(crd_name);
        if let Some(first) = types.first() {
            self.crd_of.insert(crd_name.to_string(), first.group_resource());
        }
        for rt in types {
            self.insert(rt);
        }
    }

    /// Serves a stored CRD's kinds (again, when it is rewritten or
    /// loaded); one whose types do not parse serves nothing.
    pub fn serve_crd(&mut self, crd: &Value) {
        if let Ok(types) = from_crd(crd) {
            self.register_crd(meta_str(crd, "name"), types);
        }
    }

    /// Returns the group-resource the CRD had registered.
    pub fn unregister_crd(&mut self, crd_name: &str) -> Option<String> {
        let gr = self.crd_of.remove(crd_name)?;
        self.by_gvr
            .retain(|_, rt| !(rt.custom && rt.group_resource() == gr));
        Some(gr)
    }

    /// Groups and their versions, in a stable order, preferred (storage) version first.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<(bool, String)>> = BTreeMap::new();
        for rt in self.by_gvr.values() {
            if rt.group.is_empty() {
                continue;
            }
            let vs = groups.entry(rt.group.clone()).or_default();
            if !vs.iter().any(|(_, v)| v == &rt.version) {
                vs.push((rt.storage, rt.version.clone()));
            }
        }
        groups
            .into_iter()
            .map(|(g, mut vs)| {
                vs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                (g, vs.into_iter().map(|(_, v)| v).collect())
            })
            .collect()
    }

    /// Resource types served under one group/version, sorted by plural.
    pub fn resources_of(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        let mut out: Vec<_> = self
            .by_gvr
            .values()
            .filter(|rt| rt.group == group && rt.version == version)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.plural.cmp(&b.plural));
        out
    }

    pub fn all(&self) -> Vec<Arc<ResourceType>> {
        self.by_gvr.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_puts_built_ins_in_the_real_servers_categories() {
        let reg = Registry::with_builtins();
        let categories = |group: &str, plural: &str| {
            let rt = reg.get(group, "v1", plural).expect("served");
            rt.discovery_entries()[0]["categories"].clone()
        };
        assert_eq!(categories("apps", "deployments"), json!(["all"]));
        assert_eq!(
            categories("apiextensions.k8s.io", "customresourcedefinitions"),
            json!(["api-extensions"])
        );
        // Absent rather than empty, as a real server lists kinds without one.
        assert_eq!(categories("", "configmaps"), Value::Null);
    }

    #[test]
    fn reviews_are_create_only_and_cluster_wide() {
        let reg = Registry::with_builtins();
        for (group, version, plural) in [
            ("authentication.k8s.io", "v1", "selfsubjectreviews"),
            ("authentication.k8s.io", "v1beta1", "selfsubjectreviews"),
            ("authorization.k8s.io", "v1", "selfsubjectaccessreviews"),
            ("authorization.k8s.io", "v1", "selfsubjectrulesreviews"),
        ] {
            let rt = reg.get(group, version, plural).expect("served");
            let entry = &rt.discovery_entries()[0];
            assert_eq!(entry["verbs"], json!(["create"]), "{plural}");
            assert_eq!(entry["namespaced"], json!(false), "{plural}");
        }
        assert_eq!(reg.groups()["authentication.k8s.io"], ["v1", "v1beta1"]);
    }
}
