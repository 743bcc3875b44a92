//! den-console: the operator console (binary `den`).
//!
//! Layers, from pure to effectful:
//! - [`model`]: a pure reducer over session events ([`den_protocol::session`]) with the
//!   derived rows of every panel;
//! - [`app`]: the interactive state (focus, tables, modes, palette) as a pure
//!   `update(action) -> effects` machine;
//! - [`ui`]: widgets that only draw from `(&App, &Model, &Theme, now)`;
//! - [`theme`]: colour themes from TOML;
//! - [`sources`], [`commands`], [`tui`], [`status`]: the runtime (sockets, HTTP, the
//!   commands with the placement driver and its fence store, the terminal, `den status`).

pub mod app;
pub mod fixtures;
pub mod http;
pub mod model;
pub mod record;
pub mod replay;
pub mod theme;
pub mod ui;

pub mod commands;
pub mod config;
pub mod demo;
pub mod sources;
pub mod status;
#[cfg(test)]
mod testing;
pub mod tui;
