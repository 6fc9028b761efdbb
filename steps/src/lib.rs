//! The building blocks of the real ingest steps.
//!
//! Each module is a piece of work a step does, kept free of ZooKeeper, HTTP
//! and the event log so that it can be tested on its own: the worker steps
//! in the `ingest` crate put them together.
pub mod assemble;
pub mod bagit;
pub mod beneath;
pub mod checkm;
pub mod container;
pub mod digest;
pub mod erc;
pub mod forms;
pub mod inventory;
pub mod mime;
pub mod noid;
pub mod ocfl;
pub mod paths;
pub mod signing;
pub mod stamp;
pub mod storage_manifest;
