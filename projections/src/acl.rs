//! ZooKeeper access control: `digest` credentials and the ACL of every node
//! the engine creates.
//!
//! Without credentials ([`ZkAccess::is_open`]) every node is created
//! `world:anyone ALL`, as mrt-zk creates them: anyone who reaches the
//! ensemble may write the tree. With credentials the engine's session
//! authenticates (`addauth digest user:password`) and every node it creates
//! carries
//! - the engine's identity (`digest:user:base64(sha1(user:password))`) `ALL`,
//! - `world:anyone READ` (Merritt's readers and admin views keep reading),
//! - on the parents of lock nodes only (`/jobs/JID`, `/batches/BID`,
//!   `/access/{small,large}/QID`,
//!   `/locks/localid`, `/locks/storage`, `/locks/inventory`), the workers'
//!   identity `CREATE|DELETE`, so a worker can take and release its
//!   ephemeral locks and nothing else. ZooKeeper checks both rights on the
//!   parent, per parent and not per child name: the worker identity can
//!   therefore also create or delete *other* children of those nodes (a
//!   job's `status`, say); it can never write the data of a node, and an
//!   anonymous client can do neither.
//!
//! With a Merritt identity ([`ZkAccess::merritt`], issue 23), the nodes of
//! the queue Merritt's services write through mrt-zk (`/jobs`, `/batches`,
//! `/access`, `/locks` and everything under them) also carry that identity
//! `READ|WRITE|CREATE|DELETE` (never `ADMIN`): its status changes,
//! creations, acquisitions, holds and deletions reach ZooKeeper, and the
//! engine, in adoption mode, turns each into the command it means or
//! reverts and records it. The engine's own nodes (`/ingest-engine`) and
//! the root stay the engine's, and an anonymous client still only reads.
//!
//! Lock nodes themselves (worker locks, object locks, the leader node) are
//! created `world:anyone READ` whatever the mode ([`lock_options`]): nobody
//! writes a lock after creating it, its removal is a right on the parent,
//! and so no one can rewrite the fence digest a lock holds.

use std::fmt;

use base64::Engine as _;
use sha1::{Digest as _, Sha1};
use zookeeper_client as zk;

/// The longest `user:password` accepted.
pub const MAX_CREDENTIALS_BYTES: usize = 1024;

/// `digest` credentials: `user:password`. Never printed (its `Debug` and
/// `Display` show the user only).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({}:***)", self.user)
    }
}

impl fmt::Display for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:***", self.user)
    }
}

/// What is wrong with credentials or a digest identity. No variant quotes
/// the text: it may hold a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    /// An empty user name.
    #[error("the user name is empty")]
    EmptyUser,
    /// A user name too long or with spaces or control characters.
    #[error("the user name must be at most 256 characters without spaces or control characters")]
    BadUser,
    /// Credentials longer than [`MAX_CREDENTIALS_BYTES`].
    #[error("the credentials are longer than {MAX_CREDENTIALS_BYTES} bytes")]
    TooLong,
    /// Credentials of more than one line.
    #[error("the credentials must be one line, user:password")]
    NotOneLine,
    /// Credentials without a `:`.
    #[error("the credentials must have the form user:password")]
    NoColon,
    /// An empty password.
    #[error("the password is empty")]
    EmptyPassword,
    /// A digest identity without a `:`.
    #[error("a digest identity has the form user:BASE64 (see `ingest zk-digest`)")]
    NotADigestId,
    /// A digest that is not 28 characters of base64 for 20 bytes.
    #[error("the digest of a digest identity is 28 characters of base64 (the SHA-1 of user:password); `ingest zk-digest` computes it")]
    BadDigest,
}

fn check_user(user: &str) -> Result<(), CredentialsError> {
    if user.is_empty() {
        return Err(CredentialsError::EmptyUser);
    }
    if user.len() > 256 || user.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(CredentialsError::BadUser);
    }
    Ok(())
}

impl Credentials {
    /// Parses `user:password` (one line; a final line break is dropped).
    /// The message on error never quotes the text.
    ///
    /// # Errors
    /// What is wrong: empty, too long, no `:`, an empty user or password.
    pub fn parse(text: &str) -> Result<Credentials, CredentialsError> {
        let text = text.strip_suffix('\n').unwrap_or(text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        if text.len() > MAX_CREDENTIALS_BYTES {
            return Err(CredentialsError::TooLong);
        }
        if text.contains('\n') {
            return Err(CredentialsError::NotOneLine);
        }
        let Some((user, password)) = text.split_once(':') else {
            return Err(CredentialsError::NoColon);
        };
        check_user(user)?;
        if password.is_empty() {
            return Err(CredentialsError::EmptyPassword);
        }
        Ok(Credentials {
            user: user.to_string(),
            password: password.to_string(),
        })
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// What the session sends with `addauth digest`.
    pub fn auth_bytes(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }

    /// The identity ZooKeeper gives a session that authenticated with these
    /// credentials (as ZooKeeper's `DigestAuthenticationProvider` computes it).
    pub fn id(&self) -> DigestId {
        let digest = Sha1::digest(format!("{}:{}", self.user, self.password).as_bytes());
        DigestId(format!(
            "{}:{}",
            self.user,
            base64::engine::general_purpose::STANDARD.encode(digest)
        ))
    }
}

/// A `digest` identity, `user:base64(sha1(user:password))`: what an ACL
/// names. Not a secret in itself (it is what `getAcl` shows), though it
/// makes a password guessable offline; keep it among the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestId(String);

impl DigestId {
    /// Parses `user:DIGEST` (the digest: 28 characters of base64).
    ///
    /// # Errors
    /// What is wrong, without quoting the text.
    pub fn parse(text: &str) -> Result<DigestId, CredentialsError> {
        let text = text.trim();
        let Some((user, digest)) = text.rsplit_once(':') else {
            return Err(CredentialsError::NotADigestId);
        };
        check_user(user)?;
        let ok = digest.len() == 28
            && base64::engine::general_purpose::STANDARD
                .decode(digest)
                .is_ok_and(|d| d.len() == 20);
        if !ok {
            return Err(CredentialsError::BadDigest);
        }
        Ok(DigestId(text.to_string()))
    }

    /// The identity as ZooKeeper writes it (`user:BASE64`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DigestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who the session is and which ACLs the nodes it creates carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZkAccess {
    /// The credentials this process authenticates with; `None`: anonymous,
    /// and every node created open (`world:anyone ALL`).
    pub credentials: Option<Credentials>,
    /// The workers' identity, given `CREATE|DELETE` on the parents of lock
    /// nodes. Only the engine needs it.
    pub worker: Option<DigestId>,
    /// Also give `world:anyone` `CREATE|DELETE` on the object-lock parents
    /// (`/locks/localid`, `/locks/storage`, `/locks/inventory`), so that
    /// Merritt's services, which do not authenticate, can take their object
    /// locks beside `ingest` (a mixed deployment).
    pub open_object_locks: bool,
    /// Merritt's services' identity (mrt-zk clients that authenticate),
    /// given `READ|WRITE|CREATE|DELETE` on the queue's nodes
    /// ([`is_merritt_path`]). Only the engine needs it.
    pub merritt: Option<DigestId>,
}

/// Whether `path` (under the root) is a node of the queue Merritt's
/// services write through mrt-zk: `/jobs`, `/batches`, `/access`, `/locks`
/// and everything under them.
pub fn is_merritt_path(path: &str) -> bool {
    ["/jobs", "/batches", "/access", "/locks"]
        .iter()
        .any(|top| {
            path == *top
                || path
                    .strip_prefix(top)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
}

/// The ACL list of one node, owned; [`NodeAcl::persistent`] borrows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAcl(Vec<zk::Acl>);

impl NodeAcl {
    /// Options to create a persistent node with this ACL.
    pub fn persistent(&self) -> zk::CreateOptions<'_> {
        zk::CreateMode::Persistent.with_acls(zk::Acls::new(&self.0))
    }

    /// The entries.
    pub fn entries(&self) -> &[zk::Acl] {
        &self.0
    }
}

/// Whether `path` (under the root) is the parent of lock nodes workers
/// create: a job or batch node, or an object-lock directory.
pub fn is_lock_parent(path: &str) -> bool {
    is_object_lock_parent(path)
        || match path.split('/').collect::<Vec<_>>().as_slice() {
            ["", "jobs", id] => *id != "states" && !id.is_empty(),
            ["", "batches", id] => !id.is_empty(),
            // An assembly request: its daemons lock `/access/<q>/QID/lock`.
            ["", "access", "small" | "large", id] => !id.is_empty(),
            _ => false,
        }
}

/// Whether `path` is one of the object-lock directories.
pub fn is_object_lock_parent(path: &str) -> bool {
    matches!(
        path,
        "/locks/localid" | "/locks/storage" | "/locks/inventory"
    )
}

/// Options for an ephemeral lock node (see the module docs): readable by
/// all, writable by none.
pub fn lock_options() -> zk::CreateOptions<'static> {
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_read())
}

impl ZkAccess {
    /// Whether the session is anonymous and the tree open to anyone.
    pub fn is_open(&self) -> bool {
        self.credentials.is_none()
    }

    /// The ACL of the node at `path` (under the root) when the engine
    /// creates it.
    pub fn acl(&self, path: &str) -> NodeAcl {
        let Some(own) = &self.credentials else {
            return NodeAcl(zk::Acls::anyone_all().to_vec());
        };
        let own = own.id();
        let mut acl = vec![zk::Acl::new(
            zk::Permission::ALL,
            zk::AuthId::new("digest", own.as_str()),
        )];
        let anyone = if self.open_object_locks && is_object_lock_parent(path) {
            zk::Permission::READ | zk::Permission::CREATE | zk::Permission::DELETE
        } else {
            zk::Permission::READ
        };
        acl.push(zk::Acl::new(anyone, zk::AuthId::anyone()));
        if let Some(worker) = &self.worker {
            if is_lock_parent(path) && worker != &own {
                acl.push(zk::Acl::new(
                    zk::Permission::CREATE | zk::Permission::DELETE,
                    zk::AuthId::new("digest", worker.as_str()),
                ));
            }
        }
        if let Some(merritt) = &self.merritt {
            if is_merritt_path(path) && merritt != &own {
                acl.push(zk::Acl::new(
                    zk::Permission::READ
                        | zk::Permission::WRITE
                        | zk::Permission::CREATE
                        | zk::Permission::DELETE,
                    zk::AuthId::new("digest", merritt.as_str()),
                ));
            }
        }
        NodeAcl(acl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_zookeepers() {
        // ZooKeeper's DigestAuthenticationProvider.generateDigest("super:test").
        let c = Credentials::parse("super:test\n").expect("valid");
        assert_eq!(c.id().as_str(), "super:D/InIHSb7yEEbrWz8b9l71RjZJU=");
        assert_eq!(format!("{c:?}"), "Credentials(super:***)");
        assert!(!format!("{c} {c:?}").contains("test"));
        assert!(DigestId::parse(c.id().as_str()).is_ok());
    }

    #[test]
    fn bad_credentials_are_refused_without_quoting_them() {
        for bad in ["", "nopassword", ":pw", "user:", "a b:pw", "u:p\nq"] {
            let e = Credentials::parse(bad).expect_err(bad);
            assert!(bad.len() < 3 || !e.to_string().contains(bad), "{e}");
        }
        assert!(Credentials::parse(&format!("u:{}", "x".repeat(2000))).is_err());
        for bad in [
            "worker",
            "worker:short",
            "worker:!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
        ] {
            assert!(DigestId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn acls_give_workers_the_lock_parents_only() {
        let open = ZkAccess::default();
        assert_eq!(
            open.acl("/jobs/jid0000000001").entries(),
            &zk::Acls::anyone_all()[..]
        );
        let worker = Credentials::parse("worker:w").expect("valid").id();
        let access = ZkAccess {
            credentials: Some(Credentials::parse("engine:e").expect("valid")),
            worker: Some(worker.clone()),
            open_object_locks: false,
            merritt: None,
        };
        let has_worker = |p: &str| {
            access
                .acl(p)
                .entries()
                .iter()
                .any(|a| a.auth_id() == &zk::AuthId::new("digest", worker.as_str()))
        };
        for p in [
            "/jobs/jid0000000001",
            "/batches/bid0000000001",
            "/access/small/qid0000000001",
            "/access/large/qid0000000002",
            "/locks/localid",
            "/locks/storage",
            "/locks/inventory",
        ] {
            assert!(has_worker(p), "{p}");
        }
        for p in [
            "/",
            "/jobs",
            "/jobs/states",
            "/jobs/jid0000000001/status",
            "/batches/bid0000000001/states",
            "/access/small",
            "/access/small/qid0000000001/status",
            "/locks/queue",
            "/ingest-engine/checkpoint",
        ] {
            assert!(!has_worker(p), "{p}");
            let anyone: Vec<_> = access
                .acl(p)
                .entries()
                .iter()
                .filter(|a| a.auth_id() == &zk::AuthId::anyone())
                .map(|a| a.permission())
                .collect();
            assert_eq!(anyone, vec![zk::Permission::READ], "{p}");
        }
    }

    #[test]
    fn a_merritt_identity_writes_the_queue_and_nothing_of_the_engine() {
        let merritt = Credentials::parse("merritt:m").expect("valid").id();
        let access = ZkAccess {
            credentials: Some(Credentials::parse("engine:e").expect("valid")),
            merritt: Some(merritt.clone()),
            ..ZkAccess::default()
        };
        let rights = |p: &str| {
            access
                .acl(p)
                .entries()
                .iter()
                .find(|a| a.auth_id() == &zk::AuthId::new("digest", merritt.as_str()))
                .map(|a| a.permission())
        };
        let writes = zk::Permission::READ
            | zk::Permission::WRITE
            | zk::Permission::CREATE
            | zk::Permission::DELETE;
        for p in [
            "/jobs",
            "/jobs/jid0000000001",
            "/jobs/jid0000000001/status",
            "/jobs/states/pending",
            "/batches",
            "/batches/bid0000000001/states/batch-processing",
            "/access/small/qid0000000001/status",
            "/locks",
            "/locks/queue",
            "/locks/collections",
            "/locks/storage",
        ] {
            assert_eq!(rights(p), Some(writes), "{p}");
        }
        for p in [
            "/",
            "/ingest-engine",
            "/ingest-engine/checkpoint",
            "/jobsx",
            "/lockss/x",
        ] {
            assert_eq!(rights(p), None, "{p}");
        }
    }
}
