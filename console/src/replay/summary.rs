//! The incident summary.
