//! The six panels and how their rows take part in tables.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::table::TableRow;
use crate::model::{
    DownloadRow, EventLine, Identity, InstanceRow, MembershipView, NodeRow, PageRow, RouteRow,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Panel {
    Nodes,
    Downloads,
    Instances,
    Pages,
    Routes,
    Events,
}

impl Panel {
    pub const ALL: [Panel; 6] = [
        Panel::Nodes,
        Panel::Downloads,
        Panel::Instances,
        Panel::Pages,
        Panel::Routes,
        Panel::Events,
    ];

    pub fn index(self) -> usize {
        match self {
            Panel::Nodes => 0,
            Panel::Downloads => 1,
            Panel::Instances => 2,
            Panel::Pages => 3,
            Panel::Routes => 4,
            Panel::Events => 5,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Panel::Nodes => "Nodes",
            Panel::Downloads => "Downloads",
            Panel::Instances => "Instances",
            Panel::Pages => "Pages",
            Panel::Routes => "Routes",
            Panel::Events => "Events",
        }
    }

    /// The palette alias (`:nodes`).
    pub fn alias(self) -> &'static str {
        match self {
            Panel::Nodes => "nodes",
            Panel::Downloads => "downloads",
            Panel::Instances => "instances",
            Panel::Pages => "pages",
            Panel::Routes => "routes",
            Panel::Events => "events",
        }
    }

    pub fn from_alias(s: &str) -> Option<Panel> {
        Panel::ALL.into_iter().find(|p| {
            p.alias() == s || (s.len() >= 2 && p.alias().starts_with(s)) || s == &p.alias()[..1]
        })
    }

    // Indexing below is modulo the length of `ALL`, so it cannot fail.
    pub fn next(self) -> Panel {
        Panel::ALL[(self.index() + 1) % Panel::ALL.len()]
    }

    pub fn prev(self) -> Panel {
        Panel::ALL[(self.index() + Panel::ALL.len() - 1) % Panel::ALL.len()]
    }
}

impl std::fmt::Display for Panel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.alias())
    }
}

fn join_lower(parts: &[&str]) -> String {
    parts.join(" ").to_lowercase()
}

impl TableRow for NodeRow {
    fn key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.node.as_str())
    }

    fn filter_text(&self) -> String {
        let identity = match &self.identity {
            Identity::Bound { source } => format!("bound {source}"),
            Identity::Conflict { .. } => "conflict".to_owned(),
            Identity::NotBound => "unbound".to_owned(),
        };
        let membership = match &self.membership {
            MembershipView::Member { .. } => "member",
            MembershipView::OneSided { .. } => "one-sided",
            MembershipView::NotMember => "not-member",
            MembershipView::Unknown => "unknown",
        };
        let workers: Vec<&str> = self.workers.iter().map(|w| w.as_str()).collect();
        join_lower(&[
            self.node.as_str(),
            self.name.as_deref().unwrap_or(""),
            &identity,
            membership,
            &workers.join(" "),
            self.health_level.as_deref().unwrap_or(""),
            &self.health_reasons.join(" "),
            if self.draining { "draining" } else { "" },
        ])
    }
}

impl TableRow for DownloadRow {
    fn key(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.key)
    }

    fn group(&self) -> Option<&str> {
        Some(&self.group)
    }

    fn filter_text(&self) -> String {
        join_lower(&[
            self.node.as_str(),
            &self.model,
            self.attempt.as_deref().unwrap_or("legacy"),
            &format!("{:?}", self.status),
            self.error.as_deref().unwrap_or(""),
            self.contradiction.as_deref().unwrap_or(""),
        ])
    }
}

impl TableRow for InstanceRow {
    fn key(&self) -> Cow<'_, str> {
        match self {
            InstanceRow::Instance { instance, .. } => Cow::Borrowed(instance),
            InstanceRow::Assignment { instance, node, .. } => {
                Cow::Owned(format!("{instance}/{node}"))
            }
        }
    }

    fn group(&self) -> Option<&str> {
        Some(self.instance())
    }

    fn filter_text(&self) -> String {
        match self {
            InstanceRow::Instance {
                instance,
                model,
                verdict,
                ..
            } => join_lower(&[
                instance,
                model.as_deref().unwrap_or(""),
                &verdict.kind,
                &verdict.reasons.join(" "),
            ]),
            InstanceRow::Assignment {
                node,
                runner,
                download,
                runner_status,
                ..
            } => join_lower(&[node.as_str(), runner, &download.note, &runner_status.note]),
        }
    }
}

impl TableRow for PageRow {
    fn key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.worker.as_str())
    }

    fn filter_text(&self) -> String {
        join_lower(&[
            self.worker.as_str(),
            self.node.as_str(),
            &self.backend,
            if self.draining { "draining" } else { "" },
            if self.gone.is_some() { "gone" } else { "" },
        ])
    }
}

impl TableRow for RouteRow {
    fn key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.request.as_str())
    }

    fn filter_text(&self) -> String {
        join_lower(&[
            self.request.as_str(),
            &self.model,
            self.worker.as_ref().map_or("", |w| w.as_str()),
            self.tier.map_or("", |t| t.as_str()),
            self.phase.as_str(),
            &self.setbacks.join(" "),
        ])
    }
}

impl TableRow for EventLine {
    fn key(&self) -> Cow<'_, str> {
        Cow::Owned(self.seq.to_string())
    }

    fn filter_text(&self) -> String {
        join_lower(&[self.source.as_ref().map_or("", |s| s.as_str()), &self.text])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_accept_prefixes() {
        assert_eq!(Panel::from_alias("nodes"), Some(Panel::Nodes));
        assert_eq!(Panel::from_alias("ro"), Some(Panel::Routes));
        assert_eq!(Panel::from_alias("d"), Some(Panel::Downloads));
        assert_eq!(Panel::from_alias("x"), None);
        assert_eq!(Panel::Events.next(), Panel::Nodes);
        assert_eq!(Panel::Nodes.prev(), Panel::Events);
    }
}
