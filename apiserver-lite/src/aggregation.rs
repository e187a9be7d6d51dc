//! ClusterRole aggregation, as kube-apiserver's controller does it, but
//! within the write that changed a ClusterRole: a role with an
//! `aggregationRule` holds the rules of every ClusterRole its selectors
//! match.

use serde_json::Value;

use crate::authz::CLUSTER_ROLES;
use crate::object::Object;
use crate::selectors::LabelSelector;
use crate::store::Txn;

/// How many rounds aggregation takes at most: roles aggregated into roles
/// (view into edit into admin) settle in as many rounds as the chain is
/// long; a cycle of aggregated roles would never settle.
const MAX_ROUNDS: usize = 8;

/// After `written` (a ClusterRole) was stored: aggregation brought up to
/// date, and the role as it now stands (its rules are aggregated if it
/// aggregates).
pub fn after_write(txn: &mut Txn<'_>, written: Object) -> Object {
    aggregate(txn);
    let name = written.value()["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    txn.state
        .get_object(CLUSTER_ROLES, "", &name)
        .cloned()
        .unwrap_or(written)
}

/// Brings every aggregated ClusterRole's rules up to date with the roles
/// its selectors match, within the write that changed a ClusterRole.
pub fn aggregate(txn: &mut Txn<'_>) {
    for _ in 0..MAX_ROUNDS {
        let roles: Vec<Value> = txn
            .state
            .list(CLUSTER_ROLES, None)
            .filter_map(|(_, o)| o.tree().cloned())
            .collect();
        let changes: Vec<Value> = roles
            .iter()
            .filter_map(|role| {
                let rules = aggregated_rules(role, &roles)?;
                (role["rules"] != rules).then(|| {
                    let mut new = role.clone();
                    new["rules"] = rules;
                    new
                })
            })
            .collect();
        if changes.is_empty() {
            return;
        }
        for new in changes {
            txn.put(CLUSTER_ROLES, new);
        }
    }
    tracing::warn!(
        "ClusterRole aggregation did not settle: do aggregated roles select each other in a cycle?"
    );
}

/// The rules `role` aggregates from `all`, or `None` when it aggregates
/// nothing: the matching roles' rules in their names' order, each rule
/// once. A selector that cannot be read selects nothing.
pub fn aggregated_rules(role: &Value, all: &[Value]) -> Option<Value> {
    let selectors = role["aggregationRule"]["clusterRoleSelectors"].as_array()?;
    let selectors: Vec<LabelSelector> = selectors
        .iter()
        .filter_map(|s| LabelSelector::from_object(s).ok())
        .collect();
    let own = &role["metadata"]["name"];
    let mut rules: Vec<Value> = Vec::new();
    // `all` is listed in key order, that is by name.
    for other in all {
        if other["metadata"]["name"] == *own || !selectors.iter().any(|s| s.matches(other)) {
            continue;
        }
        for rule in other["rules"].as_array().into_iter().flatten() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
    }
    Some(Value::Array(rules))
}
