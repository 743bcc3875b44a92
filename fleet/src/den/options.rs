//! den's iteration steps: which estimator inputs each version of the policy uses.

use serde::{Deserialize, Serialize};

/// How a worker's `queue_ms` is predicted from its observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueModel {
    /// v1: prompt tokens pending prefill × measured prefill ms/token (one EWMA per
    /// worker); the request's own prefill likewise (`missing × ms/token`).
    PendingPrefill,
    /// v2: pending work priced by the roofline shape of [`crate::cost::CostModel::solo_prefill_ms`]
    /// (dense + causal attention, so long prompts cost superlinearly) over each pending
    /// request's remaining range, times the worker's measured/modelled calibration
    /// factor; the request's own prefill priced the same way per candidate.
    Calibrated,
}

/// Knobs of den's policy (each iteration step of the benchmark is one setting).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DenOptions {
    pub queue: QueueModel,
    /// v3: SSD and object loads wait for the worker's NVMe / NIC queue to drain, and the
    /// GPU restore for its PCIe queue (backlogs the worker reports).
    pub link_backlog: bool,
    /// v4: a worker whose pool is full right now is not infeasible but slower: it queues
    /// the request until running requests release enough blocks (the worker reports when
    /// it expects them to), and that wait joins `queue_ms`.
    pub capacity_wait: bool,
    /// v5: choose by the request's own predicted TTFT *plus* the delay it imposes on the
    /// requests already pending on the worker: its first chunk joins their last, partly
    /// filled prefill step and lengthens it (chunked prefill packs the token budget FCFS).
    /// The prediction reported stays the request's own.
    #[serde(default)]
    pub marginal_delay: bool,
    /// v6: each candidate's queue and the delay it imposes come from replaying the
    /// worker's engine plan with the request added ([`crate::plan`]).
    #[serde(default)]
    pub replay: bool,
    /// den-agent's router: the policy is `den_protocol::router_node::RouterNode`
    /// itself ([`super::NodePolicy`]); the study fields above are not read.
    #[serde(default)]
    pub router_pricing: bool,
    /// den-agent's router: how many requests may wait in it for KV pages
    /// (`den-agent router --max-waiting`; 0: refused at once, 503 with `Retry-After`).
    #[serde(default = "default_max_waiting")]
    pub max_waiting: usize,
}

fn default_max_waiting() -> usize {
    den_protocol::router_node::DEFAULT_MAX_WAITING
}

impl Default for DenOptions {
    /// What den-agent's router runs.
    fn default() -> Self {
        DenOptions::router()
    }
}

impl DenOptions {
    /// The first version measured: v1 queue model, no link backlog.
    pub fn v1() -> DenOptions {
        DenOptions {
            queue: QueueModel::PendingPrefill,
            link_backlog: false,
            capacity_wait: false,
            max_waiting: default_max_waiting(),
            marginal_delay: false,
            replay: false,
            router_pricing: false,
        }
    }

    /// v2: calibrated roofline queue and prefill model, no link backlog.
    pub fn v2() -> DenOptions {
        DenOptions {
            queue: QueueModel::Calibrated,
            ..DenOptions::v1()
        }
    }

    /// v3: v2 plus link backlogs.
    pub fn v3() -> DenOptions {
        DenOptions {
            link_backlog: true,
            ..DenOptions::v2()
        }
    }

    /// v4: v3 plus capacity wait.
    pub fn v4() -> DenOptions {
        DenOptions {
            capacity_wait: true,
            ..DenOptions::v3()
        }
    }

    /// v5: v4 plus the marginal delay on the worker's pending requests.
    pub fn v5() -> DenOptions {
        DenOptions {
            marginal_delay: true,
            ..DenOptions::v4()
        }
    }

    /// v6: v5 with queue and imposed delay from the replayed engine plan.
    pub fn v6() -> DenOptions {
        DenOptions {
            replay: true,
            ..DenOptions::v5()
        }
    }

    /// den-agent's router: the policy is its router node itself
    /// (`den_protocol::router_node::RouterNode`, driven by the simulated workers'
    /// heartbeats, publications and results); the other fields are not read.
    pub fn router() -> DenOptions {
        DenOptions {
            router_pricing: true,
            ..DenOptions::v1()
        }
    }

    /// `router` (the default: [`DenOptions::router`], what den-agent runs) or a study
    /// step `v1` … `v6` (experiments, never what den-agent runs).
    pub fn preset(name: &str) -> Option<DenOptions> {
        match name {
            "router" => Some(DenOptions::router()),
            "v1" => Some(DenOptions::v1()),
            "v2" => Some(DenOptions::v2()),
            "v3" => Some(DenOptions::v3()),
            "v4" => Some(DenOptions::v4()),
            "v5" => Some(DenOptions::v5()),
            "v6" => Some(DenOptions::v6()),
            _ => None,
        }
    }

    /// What the `den` rows of a report are, in one line.
    pub fn describe(&self) -> &'static str {
        // The router's own settings (`max_waiting`) do not make it a study step: what
        // decides is whether den-agent's router node routes.
        if self.router_pricing {
            "den = den-agent's router: its RouterNode, fed the simulated workers' heartbeats (engine plans, pool, GPU prefixes), publications and results (--den router)"
        } else {
            "den = a STUDY STEP of the policy (--den vN), not what den-agent's router runs (that is --den router, the default)"
        }
    }
}
