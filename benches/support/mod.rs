//! Code shared by the benches (not a bench itself: cargo only takes
//! `benches/*.rs` and `benches/*/main.rs` as bench targets). Each bench uses
//! part of it.
#![allow(dead_code)]

pub mod log_builder;
pub mod zk_server;
