//! Integration tests of the `ingest` binary and services. One test target
//! with shared helpers in `util`, as ripgrep keeps `tests/util.rs`.

mod access;
mod api;
mod assembly;
mod audit;
mod backup;
mod cli;
mod deploy;
mod depositors;
mod disk_full;
mod dispatch;
mod docs;
mod failover;
mod first_deposit;
mod foreign;
mod holds;
mod ingest;
mod remote;
mod replication;
mod serve;
mod server;
mod service;
mod shutdown;
mod storage;
mod ui;
mod upgrade;
mod util;
mod worker;
mod zk;
mod zk_server;
