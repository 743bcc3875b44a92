//! Replaying a worker's prefill plan: den-protocol's [`den_protocol::engine_plan`], the
//! one the router prices candidates with. The simulated workers report it as den's real
//! workers do; [`crate::cost::CostModel::step_costs`] gives its step costs.

pub use den_protocol::engine_plan::{EnginePlan, PendingPrefill, Replay, StepCosts, replay};
