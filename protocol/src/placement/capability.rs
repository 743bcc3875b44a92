//! `required_capabilities` against signed engine support claims (integration guide:
//! "every required capability must have a supported exact engine/build/hardware match,
//! and artifact-incomplete claims block admission independently. Do not infer the
//! required set from the subset of engine claims returned").
//!
//! Skulk 1.3.0 has no `/models/requirements`, so nothing here runs against it. The claim
//! shape is den's reading of `engine_support` entries: an object naming one
//! `capability` with the `engine`, `build` and `hardware` it was proven on and a
//! `status` (`supported`, or anything else) or `supported: bool`. A claim that does not
//! read that way, or leaves out any of engine, build or hardware, proves nothing: it is
//! not an exact match.

use serde::Deserialize;
use serde_json::Value;

use crate::skulk::api::ModelRequirements;

#[derive(Debug, Deserialize)]
struct EngineClaim {
    capability: String,
    #[serde(default)]
    engine: Option<String>,
    #[serde(default)]
    build: Option<String>,
    #[serde(default)]
    hardware: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    supported: Option<bool>,
}

impl EngineClaim {
    fn proves(&self, capability: &str) -> bool {
        let exact = [&self.engine, &self.build, &self.hardware]
            .iter()
            .all(|f| f.as_deref().is_some_and(|v| !v.trim().is_empty()));
        let supported = match (&self.status, self.supported) {
            (Some(status), _) => status == "supported",
            (None, Some(yes)) => yes,
            (None, None) => false,
        };
        self.capability == capability && exact && supported
    }
}

/// The required capabilities no claim proves, in the order the requirements list them.
/// Matching is exact (no case folding, no prefixes): `text` is not `text-generation`.
pub fn unproven_capabilities(requirements: &ModelRequirements) -> Vec<String> {
    let claims: Vec<EngineClaim> = requirements
        .engine_support
        .iter()
        .filter_map(|v: &Value| EngineClaim::deserialize(v).ok())
        .collect();
    requirements
        .required_capabilities
        .iter()
        .filter(|c| !claims.iter().any(|claim| claim.proves(c)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn requirements(required: &[&str], claims: Value) -> ModelRequirements {
        serde_json::from_value(json!({
            "model_id": "org/m",
            "required_capabilities": required,
            "engine_support": claims,
        }))
        .expect("requirements")
    }

    fn claim(capability: &str, status: &str) -> Value {
        json!({"capability": capability, "engine": "mlx", "build": "0.29.1",
               "hardware": "apple-m4", "status": status})
    }

    #[test]
    fn every_required_capability_needs_its_own_exact_supported_claim() {
        // proven
        let r = requirements(&["text"], json!([claim("text", "supported")]));
        assert!(unproven_capabilities(&r).is_empty());
        // the required set is not inferred from the claims returned
        let r = requirements(&["text", "tools"], json!([claim("text", "supported")]));
        assert_eq!(unproven_capabilities(&r), ["tools"]);
        // an incomplete or unsupported claim proves nothing
        let r = requirements(&["text"], json!([claim("text", "incomplete")]));
        assert_eq!(unproven_capabilities(&r), ["text"]);
        // exact: names differ, or a claim leaves out its build
        let r = requirements(&["text"], json!([claim("text-generation", "supported")]));
        assert_eq!(unproven_capabilities(&r), ["text"]);
        let r = requirements(
            &["text"],
            json!([{"capability": "text", "engine": "mlx", "hardware": "m4", "supported": true}]),
        );
        assert_eq!(unproven_capabilities(&r), ["text"]);
        // unreadable claims are skipped, not trusted
        let r = requirements(&["text"], json!(["text", {"engine": "mlx"}]));
        assert_eq!(unproven_capabilities(&r), ["text"]);
        // nothing required, nothing to prove
        let r = requirements(&[], json!([]));
        assert!(unproven_capabilities(&r).is_empty());
    }
}
