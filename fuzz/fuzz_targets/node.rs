//! ZooKeeper node data written by others (Merritt's services, an admin, an
//! attacker), read as every node type the workers and the checks read:
//! never a panic, a refusal names the node and quotes none of the data, and
//! what is read once re-encodes to data that reads back the same.
#![no_main]

use ingest_protocol::fence::LockNode;
use ingest_protocol::node::{
    decode, AccessStatusNode, AccessTokenNode, BatchStatusNode, ConfigurationNode,
    IdentifiersNode, InventoryNode, JobStatusNode, MetadataNode, NodeError, StatusReportNode,
    StoreNode, SubmissionNode,
};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn read<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(node: &'static str, data: &[u8]) {
    match decode::<T>(node, data) {
        Ok(value) => {
            let again = serde_json::to_vec(&value).expect("a node type serialises");
            let back: T = decode(node, &again).expect("what was read reads back");
            assert_eq!(back, value, "{node}");
        }
        Err(e @ (NodeError::TooLarge { .. } | NodeError::Invalid { .. })) => {
            let text = e.to_string();
            assert!(text.contains(node), "{text}");
            assert!(text.len() <= 512, "an unbounded refusal: {text}");
        }
        Err(e) => panic!("an unknown refusal: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    read::<SubmissionNode>("/batches/BID/submission", data);
    read::<BatchStatusNode>("/batches/BID/status", data);
    read::<StatusReportNode>("/batches/BID/status-report", data);
    read::<JobStatusNode>("/jobs/JID/status", data);
    read::<ConfigurationNode>("/jobs/JID/configuration", data);
    read::<IdentifiersNode>("/jobs/JID/identifiers", data);
    read::<MetadataNode>("/jobs/JID/metadata", data);
    read::<StoreNode>("/jobs/JID/store", data);
    read::<InventoryNode>("/jobs/JID/inventory", data);
    read::<AccessTokenNode>("/access/QUEUE/QID/token", data);
    read::<AccessStatusNode>("/access/QUEUE/QID/status", data);
    let _ = LockNode::read(data);
});
