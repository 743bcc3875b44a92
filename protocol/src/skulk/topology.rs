//! `/state.topology`: `{"nodes": [NodeId], "connections": {src: {dst: [edge]}}}`.
//!
//! Edges are an UNTAGGED union told apart by their keys: a socket edge has
//! `sinkMultiaddr` (whose inner keys are snake_case computed fields), an RDMA edge has
//! `sourceRdmaIface`/`sinkRdmaIface`. Anything else is kept raw.

use crate::skulk::extra::Extra;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::NodeId;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Topology {
    #[serde(default)]
    pub nodes: Vec<NodeId>,
    #[serde(default)]
    pub connections: BTreeMap<NodeId, BTreeMap<NodeId, Vec<Edge>>>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Topology {
    pub fn contains(&self, node: &NodeId) -> bool {
        self.nodes.iter().any(|n| n == node)
    }

    /// The edges from `source` to `sink`, empty when there are none.
    pub fn edges(&self, source: &NodeId, sink: &NodeId) -> &[Edge] {
        self.connections
            .get(source)
            .and_then(|sinks| sinks.get(sink))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Edge {
    Socket(SocketEdge),
    Rdma(RdmaEdge),
    /// An edge kind den does not know.
    Unknown(Value),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SocketEdge {
    #[serde(rename = "sinkMultiaddr", alias = "sink_multiaddr")]
    pub sink_multiaddr: Multiaddr,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RdmaEdge {
    #[serde(alias = "source_rdma_iface")]
    pub source_rdma_iface: String,
    #[serde(alias = "sink_rdma_iface")]
    pub sink_rdma_iface: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A libp2p multiaddress (a plain model: snake_case keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Multiaddr {
    pub address: String,
    #[serde(default)]
    pub address_type: Option<String>,
    #[serde(default)]
    pub ip_address: Option<String>,
    #[serde(default)]
    pub port: Option<u64>,
    #[serde(flatten)]
    pub extra: Extra,
}
