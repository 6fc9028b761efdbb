//! `ingest-server`: `ingest serve` — the engine, the projector, the HTTP API
//! and metrics in one process, with optional in-process workers.
//!
//! - [`serve::run`] is the whole server: start-up order, shutdown order;
//! - [`api`] is the HTTP API (routes, roles, fencing of worker reports,
//!   errors with stable codes); its bodies are `ingest_protocol`'s types;
//! - [`metrics`] is the Prometheus registry the API serves at `/metrics`;
//! - [`ui`] is the admin web UI under `/ui` (server-rendered pages over
//!   the API's own handlers, sessions with CSRF tokens).
//!
//! **Architecture invariant:** the server is the only process that holds a
//! data directory while it runs; workers and the remote CLI reach it through
//! the API only (`ingest-client`).
#![deny(missing_docs)]

pub mod api;
pub mod metrics;
pub mod serve;
pub mod ui;
