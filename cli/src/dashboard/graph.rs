//! A Job's groups as the graph their `after:` (and `order:`) edges make:
//! each group in the column after the last group it waits for, drawn as
//! SVG with one node per group, coloured (and labelled) by its state.

use std::collections::BTreeMap;

use maud::{html, Markup};

/// One group: its name, its state (lower case) and what it waits for.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub state: String,
    pub after: Vec<String>,
}

/// Each group's column: 0 for groups that wait for none, else one more
/// than the furthest group it waits for. A cycle (refused by the API) or a
/// missing group counts as nothing to wait for.
pub fn columns(nodes: &[Node]) -> BTreeMap<String, usize> {
    let by_name: BTreeMap<&str, &Node> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut column = BTreeMap::new();
    for node in nodes {
        depth(node, &by_name, &mut column, 0);
    }
    column
}

fn depth(
    node: &Node,
    by_name: &BTreeMap<&str, &Node>,
    column: &mut BTreeMap<String, usize>,
    guard: usize,
) -> usize {
    if let Some(c) = column.get(&node.name) {
        return *c;
    }
    if guard > by_name.len() {
        return 0;
    }
    let c = node
        .after
        .iter()
        .filter_map(|a| by_name.get(a.as_str()))
        .map(|d| depth(d, by_name, column, guard + 1) + 1)
        .max()
        .unwrap_or(0);
    column.insert(node.name.clone(), c);
    c
}

const W: usize = 150;
const H: usize = 44;
const GAP_X: usize = 60;
const GAP_Y: usize = 20;

/// The graph as SVG, with a title and a text equivalent (the groups' table
/// beside it carries the same facts for screen readers).
pub fn svg(nodes: &[Node]) -> Markup {
    let column = columns(nodes);
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    let mut place = BTreeMap::new();
    for node in nodes {
        let c = column.get(&node.name).copied().unwrap_or(0);
        let r = rows.entry(c).or_insert(0);
        place.insert(node.name.as_str(), (c * (W + GAP_X) + 10, *r * (H + GAP_Y) + 10));
        *r += 1;
    }
    let width = (column.values().max().copied().unwrap_or(0) + 1) * (W + GAP_X);
    let height = rows.values().max().copied().unwrap_or(1) * (H + GAP_Y) + 10;
    html! {
        svg.graph role="img" aria-labelledby="graph-title" viewBox=(format!("0 0 {width} {height}"))
            width=(width) height=(height) xmlns="http://www.w3.org/2000/svg" {
            title #graph-title { "The job's groups and the order they run in" }
            defs {
                marker #arrow viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto" {
                    path d="M0,0 L10,5 L0,10 z" class="edge-head" {}
                }
            }
            @for node in nodes {
                @for dep in &node.after {
                    @if let (Some((x1, y1)), Some((x2, y2))) = (place.get(dep.as_str()), place.get(node.name.as_str())) {
                        line.edge x1=(x1 + W) y1=(y1 + H / 2) x2=(x2) y2=(y2 + H / 2) marker-end="url(#arrow)" {}
                    }
                }
            }
            @for node in nodes {
                @let (x, y) = place[node.name.as_str()];
                g id=(format!("grp-{}", node.name)) class=(format!("node state-{}", node.state)) data-state=(node.state) {
                    rect x=(x) y=(y) width=(W) height=(H) rx="6" {}
                    text x=(x + 10) y=(y + 18) class="node-name" { (node.name) }
                    text x=(x + 10) y=(y + 35) class="node-state" { (node.state) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, after: &[&str]) -> Node {
        Node {
            name: name.into(),
            state: "pending".into(),
            after: after.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    #[test]
    fn groups_sit_one_column_after_what_they_wait_for() {
        let nodes = [
            node("c", &["a", "b"]),
            node("a", &[]),
            node("b", &["a"]),
            node("x", &[]),
        ];
        let c = columns(&nodes);
        assert_eq!((c["a"], c["b"], c["c"], c["x"]), (0, 1, 2, 0));
        let svg = svg(&nodes).into_string();
        assert!(svg.contains("id=\"grp-c\""));
        assert_eq!(svg.matches("<line").count(), 3);
    }

    #[test]
    fn a_cycle_or_a_missing_group_does_not_loop() {
        let c = columns(&[node("a", &["b"]), node("b", &["a"]), node("d", &["gone"])]);
        assert_eq!(c.len(), 3);
    }
}
