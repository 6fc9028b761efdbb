"""A Merritt service's writes to an `ingest` projection, written
independently of `ingest` with the kazoo ZooKeeper client from mrt-zk's
documented node formats and calls (its design documents and the behaviour of
its Java library: `Job.setStatus`, `QueueItemHelper.delete`,
`MerrittLocks.unlockIngestQueue`). Nothing here asks `ingest`: it is the
other client, writing the tree as Merritt's ingest, store and admin services
do.

Usage:
  python merritt_writer.py HOSTS ROOT set-status JID STATUS MESSAGE
      mrt-zk's Job.setStatus: /jobs/JID/status is rewritten with the new
      status (JSON: status, last_modified, message, retry_count,
      last_successful_status), then the queue reference moves from
      /jobs/states/<old>/PP-JID to /jobs/states/<new>/PP-JID and the batch
      reference from /batches/BID/states/batch-<old set>/JID to the new set
      (setJobStatePath, setBatchStatePath).
  python merritt_writer.py HOSTS ROOT step JID STATUS MESSAGE
      One state of a job as a Merritt daemon handles it: acquire the job
      (QueueItem.lock: the ephemeral node /jobs/JID/lock with empty data;
      exit status 3 when another session holds it), load it (read its
      nodes, as Job.load does), Job.setStatus as above, release it
      (QueueItem.unlock: delete the lock node).
  python merritt_writer.py HOSTS ROOT step-retry JID STATUS MESSAGE
      `step` with Job.setStatusWithRetry: retry_count one more than the
      status node had.
  python merritt_writer.py HOSTS ROOT steps STATUS MESSAGE JID...
      `step` for each JID in turn, in one session (one Merritt daemon
      acquiring several jobs back to back).
  python merritt_writer.py HOSTS ROOT create PATH...
      MerrittLocks.lockIngestQueue, lockSmallAccessQueue,
      lockLargeAccessQueue, lockCollection: each PATH created as a
      persistent node with empty data (an existing one is left: mrt-zk's
      createLock answers false).
  python merritt_writer.py HOSTS ROOT create-batches COUNT PROFILE PAYLOAD_URL
      Batch.createBatch COUNT times in one session: the id from a
      sequential node (QueueItemHelper.createId: /batches/bid, persistent
      sequential, empty), then /batch-uuids/UUID holding the id, then
      /batches/BID/submission (the submission JSON: profile_name,
      submitter, payload_url, type, response_type, submission_mode,
      batchID, erc_*), then /batches/BID/status created with
      {"status": "Pending", "last_modified", "message"}. A
      NodeExistsException is counted, not raised (the summary's
      "collisions"), as is any other ZooKeeper error (its name in
      "failures"); the summary's "created" lists the ids.
  python merritt_writer.py HOSTS ROOT consume-batch BID COUNT PAYLOAD_URL
      Merritt's batch consumer on one batch: Batch.acquirePendingBatch
      (lock /batches/BID/lock, load, create /batches/BID/states,
      setStatus Processing), then Job.createJob COUNT times (the id from a
      sequential /jobs/jid node; lock it; bid, priority 5, space_needed 0,
      configuration; status Pending created; the batch reference
      /batches/BID/states/batch-processing/JID and the queue reference
      /jobs/states/pending/05-JID, each parent created when missing;
      unlock), then the batch's unlock. The summary's "jobs" lists the
      ids; exit status 3 when the batch's lock is held.
  python merritt_writer.py HOSTS ROOT batch-status BID STATUS
      Batch.setStatus: /batches/BID/status rewritten (status,
      last_modified, message).
  python merritt_writer.py HOSTS ROOT access-set-status QUEUE QID STATUS MESSAGE
      Access.setStatus (QueueItem.setStatus): /access/QUEUE/QID/status
      rewritten with the old JSON's keys kept, status, last_modified and
      message replaced (QueueItem.statusObject).
  python merritt_writer.py HOSTS ROOT access-step QUEUE QID STATUS MESSAGE
      An assembler's step on one request, as mrt-store's assembly does it:
      the lock (QueueItem.lock: the ephemeral /access/QUEUE/QID/lock, empty;
      exit status 3 when another session holds it), the request loaded
      (status, token), access-set-status as above, the unlock.
  python merritt_writer.py HOSTS ROOT delete-access QUEUE QID
      Access.delete: the request loaded, refused unless its status is
      deletable (Completed or Deleted: exit status 4, nothing deleted),
      then /access/QUEUE/QID with its children (QueueItemHelper.deleteAll).
  python merritt_writer.py HOSTS ROOT delete-job JID
      Job.delete (as deleteDeletedJobs and Batch.delete call it): the job
      loaded, refused unless its status is deletable (Completed or
      Deleted: exit status 4, nothing deleted), then its queue reference
      /jobs/states/<status>/PP-JID, its batch reference
      /batches/BID/states/batch-<set>/JID, and the /jobs/JID tree
      (QueueItemHelper.deleteAll: children first).
  python merritt_writer.py HOSTS ROOT delete-batch BID
      Batch.delete (as deleteCompletedBatches calls it): refused unless the
      batch's status is Completed or Deleted (exit status 4); each job
      under states/batch-processing, -failed, -completed, -deleted deleted
      as delete-job does, then /batch-uuids/<batchID of the submission>,
      then the /batches/BID tree. MERRITT_DELETE_PAUSE=SECONDS in the
      environment waits that long after each job (a large batch's pace).
  python merritt_writer.py HOSTS ROOT delete-all PATH
      QueueItemHelper.deleteAll of PATH without mrt-zk's status check (a
      client that skips it).
  python merritt_writer.py HOSTS ROOT delete PATH...
      QueueItemHelper.delete of each node (mrt-zk's unlockIngestQueue is
      `delete /locks/queue/ingest`; its delete helpers remove a batch's
      state children the same way).

Prints a JSON summary on stdout: the session id (hex, as ZooKeeper's logs
show it) and the paths written.

With MERRITT_ZK_AUTH=user:password in the environment the session
authenticates (`addauth digest`), as a Merritt service given its own
ZooKeeper identity does.
"""

import json
import os
import sys
import time
import uuid as uuid_mod

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError, NodeExistsError

FINISHED_SETS = {"Failed": "batch-failed", "Completed": "batch-completed", "Deleted": "batch-deleted"}


def batch_set(status):
    return FINISHED_SETS.get(status, "batch-processing")


def now():
    return time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime())


def delete_quietly(zk, path, written):
    # QueueItemHelper.delete: a missing node is not an error for mrt-zk.
    try:
        zk.delete(path)
        written.append(path)
    except NoNodeError:
        pass


def set_status(zk, jid, status, message, written, retry=False):
    raw, _ = zk.get(f"/jobs/{jid}/status")
    old = json.loads(raw.decode("utf-8"))
    old_status = old["status"]
    priority = int(zk.get(f"/jobs/{jid}/priority")[0].decode("utf-8"))
    bid = zk.get(f"/jobs/{jid}/bid")[0].decode("utf-8")
    new = {
        "status": status,
        "last_modified": now(),
        "message": message,
        # Job.setStatusWithRetry: one more retry before the status.
        "retry_count": old.get("retry_count", 0) + (1 if retry else 0),
        "last_successful_status": old.get("last_successful_status"),
    }
    if status not in ("Failed", "Deleted") and status != old_status:
        new["last_successful_status"] = old_status
    zk.set(f"/jobs/{jid}/status", json.dumps(new).encode("utf-8"))
    written.append(f"/jobs/{jid}/status")

    # setJobStatePath, then setBatchStatePath.
    move(zk, f"/jobs/states/{old_status.lower()}/{priority:02d}-{jid}",
         f"/jobs/states/{status.lower()}/{priority:02d}-{jid}", written)
    move(zk, f"/batches/{bid}/states/{batch_set(old_status)}/{jid}",
         f"/batches/{bid}/states/{batch_set(status)}/{jid}", written)


def move(zk, old, new, written):
    """A reference moved as mrt-zk moves it: the old one deleted, the new
    one created (its parent first, when missing)."""
    if old == new:
        return
    delete_quietly(zk, old, written)
    # setJobStatePath / setBatchStatePath create the new one only when it
    # does not exist.
    if zk.exists(new) is None:
        zk.ensure_path(new.rsplit("/", 1)[0])
        zk.create(new, b"")
        written.append(new)


JOB_NODES = ("status", "priority", "bid", "space_needed", "configuration",
             "identifiers", "metadata", "inventory", "store")


def locked(zk, item, nodes, write, written):
    """QueueItem.lock of ITEM (the ephemeral ITEM/lock, empty), its load
    (each of NODES read), WRITE(), then QueueItem.unlock. False when
    another session holds the lock."""
    lock = f"{item}/lock"
    try:
        zk.create(lock, b"", ephemeral=True)
    except NodeExistsError:
        return False
    written.append(lock)
    for node in nodes:
        try:
            zk.get(f"{item}/{node}")
        except NoNodeError:
            pass
    write()
    zk.delete(lock)
    written.append(lock)
    return True


def step(zk, jid, status, message, written, retry=False):
    """acquireJob's lock, Job.load, setStatus, unlock."""
    return locked(zk, f"/jobs/{jid}", JOB_NODES,
                  lambda: set_status(zk, jid, status, message, written, retry), written)


def create_batch(zk, profile, payload_url, written):
    """Batch.createBatch: the sequential id, the uuid node, the submission,
    the status (QueueItem.setStatus of a new item creates the node)."""
    path = zk.create("/batches/bid", b"", sequence=True)
    bid = path.rsplit("/", 1)[1]
    uuid = str(uuid_mod.uuid4())
    zk.create(f"/batch-uuids/{uuid}", bid.encode("utf-8"))
    submission = {
        "profile_name": profile,
        "submitter": "merritt-writer",
        "payload_url": payload_url,
        "type": "file",
        "response_type": "json",
        "submission_mode": "add",
        "batchID": uuid,
        "erc_who": "",
        "erc_what": f"created by mrt-zk's createBatch pattern as {bid}",
        "erc_when": "",
        "erc_where": "",
    }
    zk.create(f"/batches/{bid}/submission", json.dumps(submission).encode("utf-8"))
    status = {"status": "Pending", "last_modified": now(), "message": ""}
    zk.create(f"/batches/{bid}/status", json.dumps(status).encode("utf-8"))
    written.append(f"/batches/{bid}")
    return bid


def set_batch_status(zk, bid, status, written):
    """QueueItem.setStatus of a batch: the status node rewritten."""
    path = f"/batches/{bid}/status"
    data = {"status": status, "last_modified": now(), "message": ""}
    zk.set(path, json.dumps(data).encode("utf-8"))
    written.append(path)


def create_job(zk, bid, payload_url, written):
    """Job.createJob with the default priority (5)."""
    path = zk.create("/jobs/jid", b"", sequence=True)
    jid = path.rsplit("/", 1)[1]
    lock = f"/jobs/{jid}/lock"
    zk.create(lock, b"", ephemeral=True)
    try:
        zk.create(f"/jobs/{jid}/bid", bid.encode("utf-8"))
        zk.create(f"/jobs/{jid}/priority", b"5")
        zk.create(f"/jobs/{jid}/space_needed", b"0")
        configuration = {
            "profile_name": "demo",
            "submitter": "merritt-writer",
            "payload_url": payload_url,
            "payload_type": "file",
            "response_type": "json",
        }
        zk.create(f"/jobs/{jid}/configuration", json.dumps(configuration).encode("utf-8"))
        status = {"status": "Pending", "last_modified": now(), "message": "",
                  "last_successful_status": None, "retry_count": 0}
        zk.create(f"/jobs/{jid}/status", json.dumps(status).encode("utf-8"))
        for ref in (f"/batches/{bid}/states/batch-processing/{jid}",
                    f"/jobs/states/pending/05-{jid}"):
            zk.ensure_path(ref.rsplit("/", 1)[0])
            if zk.exists(ref) is None:
                zk.create(ref, b"")
        written.append(f"/jobs/{jid}")
    finally:
        zk.delete(lock)
    return jid


def consume_batch(zk, bid, count, payload_url, written):
    """acquirePendingBatch on BID, then createJob COUNT times."""
    lock = f"/batches/{bid}/lock"
    try:
        zk.create(lock, b"", ephemeral=True)
    except NodeExistsError:
        return None
    try:
        zk.get(f"/batches/{bid}/submission")
        zk.create(f"/batches/{bid}/states", b"")
        set_batch_status(zk, bid, "Processing", written)
        return [create_job(zk, bid, payload_url, written) for _ in range(count)]
    finally:
        zk.delete(lock)


def access_set_status(zk, queue, qid, status, message, written):
    path = f"/access/{queue}/{qid}/status"
    data = json.loads(zk.get(path)[0].decode("utf-8"))
    data.update({"status": status, "last_modified": now(), "message": message})
    zk.set(path, json.dumps(data).encode("utf-8"))
    written.append(path)


def access_step(zk, queue, qid, status, message, written):
    """An assembler's lock, load, Access.setStatus, unlock."""
    return locked(zk, f"/access/{queue}/{qid}", ("status", "token"),
                  lambda: access_set_status(zk, queue, qid, status, message, written),
                  written)


DELETABLE = ("Completed", "Deleted")


class NotDeletable(Exception):
    pass


def delete_all(zk, path, written):
    """QueueItemHelper.deleteAll: the children first, then the node."""
    try:
        children = zk.get_children(path)
    except NoNodeError:
        return
    for child in children:
        delete_all(zk, f"{path}/{child}", written)
    delete_quietly(zk, path, written)


def delete_job(zk, jid, written):
    """Job.delete: a deletable job's references, then its tree."""
    status = json.loads(zk.get(f"/jobs/{jid}/status")[0].decode("utf-8"))["status"]
    if status not in DELETABLE:
        raise NotDeletable(f"Can not delete Job: /jobs/{jid} ({status})")
    priority = int(zk.get(f"/jobs/{jid}/priority")[0].decode("utf-8"))
    bid = zk.get(f"/jobs/{jid}/bid")[0].decode("utf-8")
    delete_quietly(zk, f"/jobs/states/{status.lower()}/{priority:02d}-{jid}", written)
    delete_quietly(zk, f"/batches/{bid}/states/{batch_set(status)}/{jid}", written)
    delete_all(zk, f"/jobs/{jid}", written)


def delete_batch(zk, bid, written):
    """Batch.delete: a deletable batch's jobs, its uuid node, its tree."""
    status = json.loads(zk.get(f"/batches/{bid}/status")[0].decode("utf-8"))["status"]
    if status not in DELETABLE:
        raise NotDeletable(f"Can not delete Batch: /batches/{bid} ({status})")
    for state in ("batch-processing", "batch-failed", "batch-completed", "batch-deleted"):
        try:
            jobs = zk.get_children(f"/batches/{bid}/states/{state}")
        except NoNodeError:
            continue
        for jid in jobs:
            delete_job(zk, jid, written)
            # A large batch: each job costs mrt-zk a load and a dozen deletes.
            time.sleep(float(os.environ.get("MERRITT_DELETE_PAUSE", "0")))
    submission = json.loads(zk.get(f"/batches/{bid}/submission")[0].decode("utf-8"))
    if submission.get("batchID"):
        delete_quietly(zk, f"/batch-uuids/{submission['batchID']}", written)
    delete_all(zk, f"/batches/{bid}", written)


def delete_access(zk, queue, qid, written):
    """Access.delete: a deletable request's tree (its children, then it)."""
    path = f"/access/{queue}/{qid}"
    status = json.loads(zk.get(f"{path}/status")[0].decode("utf-8"))["status"]
    if status not in DELETABLE:
        raise NotDeletable(f"Delete invalid for {path} ({status})")
    delete_all(zk, path, written)


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    hosts, root, command, args = argv[1], argv[2], argv[3], argv[4:]
    auth = os.environ.get("MERRITT_ZK_AUTH")
    zk = KazooClient(
        hosts=hosts + root,
        timeout=10.0,
        auth_data=[("digest", auth)] if auth else None,
    )
    zk.start(timeout=15)
    written = []
    try:
        session = zk.client_id[0]
        if command == "set-status" and len(args) == 3:
            set_status(zk, args[0], args[1], args[2], written)
        elif command == "step" and len(args) == 3:
            if not step(zk, args[0], args[1], args[2], written):
                print(json.dumps({"session": f"0x{session:x}", "locked": True}))
                return 3
        elif command == "step-retry" and len(args) == 3:
            if not step(zk, args[0], args[1], args[2], written, retry=True):
                print(json.dumps({"session": f"0x{session:x}", "locked": True}))
                return 3
        elif command == "steps" and len(args) >= 3:
            for jid in args[2:]:
                if not step(zk, jid, args[0], args[1], written):
                    print(json.dumps({"session": f"0x{session:x}", "locked": jid}))
                    return 3
        elif command == "create" and args:
            for path in args:
                try:
                    zk.create(path, b"")
                    written.append(path)
                except NodeExistsError:
                    pass
        elif command == "create-batches" and len(args) == 3:
            created, collisions, failures = [], 0, []
            for _ in range(int(args[0])):
                try:
                    created.append(create_batch(zk, args[1], args[2], written))
                except NodeExistsError:
                    collisions += 1
                except KazooException as e:
                    # A node of the batch removed under the client (the
                    # projector reverting another client's batch).
                    failures.append(type(e).__name__)
            print(json.dumps({"session": f"0x{session:x}", "created": created,
                              "collisions": collisions, "failures": failures[:20]}))
            return 0
        elif command == "consume-batch" and len(args) == 3:
            jobs = consume_batch(zk, args[0], int(args[1]), args[2], written)
            if jobs is None:
                print(json.dumps({"session": f"0x{session:x}", "locked": True}))
                return 3
            print(json.dumps({"session": f"0x{session:x}", "jobs": jobs, "written": written}))
            return 0
        elif command == "batch-status" and len(args) == 2:
            set_batch_status(zk, args[0], args[1], written)
        elif command == "access-set-status" and len(args) == 4:
            access_set_status(zk, *args, written)
        elif command == "access-step" and len(args) == 4:
            if not access_step(zk, *args, written):
                print(json.dumps({"session": f"0x{session:x}", "locked": True}))
                return 3
        elif command in ("delete-job", "delete-batch") and len(args) == 1:
            try:
                (delete_job if command == "delete-job" else delete_batch)(zk, args[0], written)
            except NotDeletable as e:
                print(json.dumps({"session": f"0x{session:x}", "refused": str(e)}))
                return 4
        elif command == "delete-access" and len(args) == 2:
            try:
                delete_access(zk, *args, written)
            except NotDeletable as e:
                print(json.dumps({"session": f"0x{session:x}", "refused": str(e)}))
                return 4
        elif command == "delete-all" and len(args) == 1:
            delete_all(zk, args[0], written)
        elif command == "delete" and args:
            for path in args:
                delete_quietly(zk, path, written)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    finally:
        zk.stop()
        zk.close()
    print(json.dumps({"session": f"0x{session:x}", "written": written}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
