//! Choosing the exact preview to submit.
//!
//! `node_ids` on `GET /instance/previews` is SUBSET matching: a preview may run on more
//! nodes than asked for. Only a preview whose actual `shardAssignments.nodeToRunner` keys
//! equal the wanted set is selected. Card digest, context limit and backend are checked
//! where the server reports them; a field the server does not report is not a refusal.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::skulk::common::one_line;
use crate::skulk::{ModelId, PlacementPreview, RegistryCardId};

/// What the selected preview must satisfy.
#[derive(Debug, Clone, PartialEq)]
pub struct Criteria<'a> {
    pub model_id: &'a ModelId,
    pub nodes: &'a BTreeSet<NodeId>,
    pub context_tokens: Option<u64>,
    /// The approved card digest (from the requirements or the operator's intent).
    pub card_digest: Option<&'a str>,
    /// The approved signed card identity, when known.
    pub registry_card_id: Option<&'a RegistryCardId>,
    /// Backends the requirements declare compatible (empty: unknown).
    pub compatible_backends: &'a [String],
}

/// Why one preview was not selected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// The server refused it (`error` set).
    Refused {
        error: String,
        error_code: Option<String>,
    },
    /// Admitted but without an instance to submit.
    NoInstance,
    ModelDiffers {
        actual: ModelId,
    },
    /// The instance would run on other nodes than wanted (subset matching).
    NodeSetDiffers {
        actual: BTreeSet<NodeId>,
    },
    CardDigestDiffers {
        expected: String,
        actual: String,
    },
    RegistryCardDiffers {
        expected: RegistryCardId,
        actual: Option<RegistryCardId>,
    },
    ContextTooSmall {
        limit: u64,
        requested: u64,
    },
    BackendIncompatible {
        backend: String,
        compatible: Vec<String>,
    },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Refused {
                error,
                error_code: Some(code),
            } => write!(f, "refused ({code}): {}", one_line(error)),
            Rejection::Refused {
                error,
                error_code: None,
            } => write!(f, "refused: {}", one_line(error)),
            Rejection::NoInstance => f.write_str("admitted without an instance"),
            Rejection::ModelDiffers { actual } => write!(f, "for another model ({actual})"),
            Rejection::NodeSetDiffers { actual } => write!(
                f,
                "runs on {} instead",
                actual
                    .iter()
                    .map(NodeId::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Rejection::CardDigestDiffers { expected, actual } => {
                write!(
                    f,
                    "card digest {actual} differs from the approved {expected}"
                )
            }
            Rejection::RegistryCardDiffers { expected, actual } => match actual {
                Some(actual) => write!(
                    f,
                    "signed card {actual} differs from the approved {expected}"
                ),
                None => write!(f, "unsigned card where {expected} was approved"),
            },
            Rejection::ContextTooSmall { limit, requested } => {
                write!(
                    f,
                    "context limit {limit} tokens is below the requested {requested}"
                )
            }
            Rejection::BackendIncompatible {
                backend,
                compatible,
            } => {
                write!(
                    f,
                    "backend {backend} is not among the compatible {}",
                    compatible.join(", ")
                )
            }
        }
    }
}

/// A rejected preview, by its position in the response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewRejection {
    pub index: usize,
    pub sharding: String,
    pub instance_meta: String,
    pub rejection: Rejection,
}

impl fmt::Display for PreviewRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {}/{}: {}",
            self.index, self.sharding, self.instance_meta, self.rejection
        )
    }
}

/// Returns the first preview that satisfies `criteria`, or why each one does not.
pub fn select_preview<'p>(
    previews: &'p [PlacementPreview],
    criteria: &Criteria<'_>,
) -> Result<(usize, &'p PlacementPreview), Vec<PreviewRejection>> {
    let mut rejections = Vec::new();
    for (index, preview) in previews.iter().enumerate() {
        match check(preview, criteria) {
            Ok(()) => return Ok((index, preview)),
            Err(rejection) => rejections.push(PreviewRejection {
                index,
                sharding: preview.sharding.to_string(),
                instance_meta: preview.instance_meta.to_string(),
                rejection,
            }),
        }
    }
    Err(rejections)
}

fn check(preview: &PlacementPreview, criteria: &Criteria<'_>) -> Result<(), Rejection> {
    if let Some(error) = &preview.error {
        return Err(Rejection::Refused {
            error: error.clone(),
            error_code: preview.error_code.clone(),
        });
    }
    if let Some(code) = &preview.error_code {
        return Err(Rejection::Refused {
            error: String::new(),
            error_code: Some(code.clone()),
        });
    }
    let Some(instance) = &preview.instance else {
        return Err(Rejection::NoInstance);
    };
    let Some(core) = instance.core() else {
        return Err(Rejection::NoInstance);
    };
    let assignments = &core.shard_assignments;
    if &preview.model_id != criteria.model_id || &assignments.model_id != criteria.model_id {
        let actual = if &preview.model_id != criteria.model_id {
            &preview.model_id
        } else {
            &assignments.model_id
        };
        return Err(Rejection::ModelDiffers {
            actual: actual.clone(),
        });
    }
    let actual_nodes = assignments.nodes();
    if &actual_nodes != criteria.nodes {
        return Err(Rejection::NodeSetDiffers {
            actual: actual_nodes,
        });
    }
    if let (Some(expected), Some(actual)) = (criteria.card_digest, preview.card_digest.as_deref())
        && expected != actual
    {
        return Err(Rejection::CardDigestDiffers {
            expected: expected.to_owned(),
            actual: actual.to_owned(),
        });
    }
    if let Some(expected) = criteria.registry_card_id {
        for shard in assignments.runner_to_shard.values() {
            let actual = shard.model_card().and_then(|c| c.registry_card_id);
            if actual.as_ref() != Some(expected) {
                return Err(Rejection::RegistryCardDiffers {
                    expected: expected.clone(),
                    actual,
                });
            }
        }
    }
    if let (Some(requested), Some(limit)) =
        (criteria.context_tokens, preview.effective_context_limit())
        && limit < requested
    {
        return Err(Rejection::ContextTooSmall { limit, requested });
    }
    if !criteria.compatible_backends.is_empty() {
        for shard in assignments.runner_to_shard.values() {
            if let Some(backend) = shard.fields().and_then(|f| f.resolved_backend.as_ref())
                && !criteria.compatible_backends.contains(backend)
            {
                return Err(Rejection::BackendIncompatible {
                    backend: backend.clone(),
                    compatible: criteria.compatible_backends.to_vec(),
                });
            }
        }
    }
    Ok(())
}
