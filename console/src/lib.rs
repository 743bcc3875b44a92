//! den-console: the operator console (binary `den`).

pub mod http;
pub mod place;
