"""A Merritt worker's view of an `ingest` projection, written independently
of `ingest` with the kazoo ZooKeeper client (as mrt-zk's Ruby library uses
the zk gem and its Java library the Apache client).

Usage: python merritt_reader.py HOSTS ROOT

It reads the tree under ROOT the way Merritt's services do and exits 0 with
a JSON summary on stdout, or 1 naming every problem on stderr:

- every queue /jobs/states/<state> lists `PP-jid…` children, taken in
  sorted order (mrt-zk's `acquireJob`: lowest priority number first);
- it takes a job's lock as mrt-zk's `Job.lock` does (an ephemeral
  /jobs/JID/lock) and releases it;
- every JSON node parses, and numbers are where they are expected;
- `profile` is in /jobs/JID/configuration, where mrt-ingest's
  InitializeConsumer looks for the collection to check holds, and in
  /batches/BID/submission, where the admin tool groups batches;
- `mode` of /jobs/JID/store parses as mrt-store's StoreConsumer parses it
  (`action/nodeID/urlencoded-ark`, nodeID an int) and `delete` is text;
- the lock parents mrt-zk's MerrittLocks.initLocks creates exist;
- the access (assembly) queues /access/small and /access/large (mrt-zk's
  Access.initNodes) list `qid…` children in sorted order; each has a
  `token` node as mrt-store's QueueUtil writes it (`token` text,
  `cloud-content-byte` and `delivery-node` integers; a request larger than
  the QueueSizeLimit, 500000000 bytes, on the large queue) and a `status`
  node with one of mrt-zk's access states; the first Pending request of a
  queue that is not paused (/locks/queue/accessSmall|accessLarge) is locked
  as mrt-zk's acquirePendingAssembly does; the counts are Access.metrics'.
"""

import json
import re
import sys
import urllib.parse

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

JSON_NODES = {
    "submission", "status", "status-report", "configuration", "identifiers",
    "metadata", "store", "inventory",
}
INT_NODES = {"priority", "space_needed"}
LOCK_PARENTS = [
    "/locks", "/locks/queue", "/locks/localid", "/locks/storage",
    "/locks/inventory", "/locks/collections",
]
QUEUE_CHILD = re.compile(r"^(\d\d)-(jid\d+)$")
ACCESS_CHILD = re.compile(r"^qid\d{10}$")
ACCESS_STATES = {"Pending", "Processing", "Completed", "Deleted", "Failed"}
ACCESS_PAUSE = {"small": "/locks/queue/accessSmall", "large": "/locks/queue/accessLarge"}
QUEUE_SIZE_LIMIT = 500000000


def main(hosts, root):
    problems = []
    summary = {"queues": {}, "nodes": 0, "json_nodes": 0, "profiles": {}, "locked": None}
    zk = KazooClient(hosts=hosts + root, timeout=10.0)
    zk.start(timeout=15)
    try:
        for parent in LOCK_PARENTS:
            if zk.exists(parent) is None:
                problems.append(f"{parent} is missing (MerrittLocks.initLocks creates it)")

        # The queues, in the order a Merritt consumer takes them.
        for state in sorted(zk.get_children("/jobs/states")):
            children = zk.get_children(f"/jobs/states/{state}")
            ordered = sorted(children)
            priorities = []
            for child in ordered:
                m = QUEUE_CHILD.match(child)
                if not m:
                    problems.append(f"/jobs/states/{state}/{child} is not PP-JID")
                    continue
                priorities.append(int(m.group(1)))
                if zk.exists(f"/jobs/{m.group(2)}") is None:
                    problems.append(f"/jobs/states/{state}/{child} names a missing job")
            if priorities != sorted(priorities):
                problems.append(f"/jobs/states/{state} is not in priority order: {priorities}")
            summary["queues"][state] = ordered

        # Take the first pending job's lock as mrt-zk's Job.lock does.
        pending = summary["queues"].get("pending", [])
        if pending:
            jid = QUEUE_CHILD.match(pending[0]).group(2)
            lock = f"/jobs/{jid}/lock"
            try:
                zk.create(lock, b"", ephemeral=True)
                summary["locked"] = jid
                zk.delete(lock)
            except NodeExistsError:
                problems.append(f"{lock} is already held")

        read_access(zk, problems, summary)

        # Every node, parsed as Merritt's readers parse it.
        stack = ["/batches", "/jobs", "/batch-uuids", "/locks"]
        while stack:
            path = stack.pop()
            data, _ = zk.get(path)
            summary["nodes"] += 1
            name = path.rsplit("/", 1)[-1]
            parent = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
            in_item = parent.startswith(("bid", "jid"))
            if in_item and name in JSON_NODES:
                try:
                    node = json.loads(data.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    problems.append(f"{path} is not JSON: {e}")
                    continue
                if not isinstance(node, dict):
                    problems.append(f"{path} is not a JSON object")
                    continue
                summary["json_nodes"] += 1
                check(path, name, parent, node, problems, summary)
            elif in_item and name in INT_NODES:
                try:
                    int(data.decode("utf-8"))
                except ValueError:
                    problems.append(f"{path} is not an integer")
            for child in zk.get_children(path):
                if path == "/jobs" and child == "states":
                    continue
                stack.append(f"{path}/{child}")
    finally:
        zk.stop()
        zk.close()
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


def read_access(zk, problems, summary):
    """The access queues as mrt-store's consumer and mrt-zk's Access read them."""
    summary["access"] = {}
    summary["access_locked"] = {}
    metrics = {"num_assemblies_completed": 0, "num_assemblies_failed": 0,
               "num_assemblies_processing": 0}
    for queue in ("small", "large"):
        qdir = f"/access/{queue}"
        if zk.exists(qdir) is None:
            problems.append(f"{qdir} is missing (Access.initNodes creates it)")
            continue
        ordered = sorted(zk.get_children(qdir))
        summary["access"][queue] = []
        first_pending = None
        for qid in ordered:
            path = f"{qdir}/{qid}"
            if not ACCESS_CHILD.match(qid):
                problems.append(f"{path} is not qid + 10 digits")
                continue
            token = load_json(zk, f"{path}/token", problems)
            status = load_json(zk, f"{path}/status", problems)
            if token is None or status is None:
                continue
            summary["nodes"] += 2
            summary["json_nodes"] += 2
            if not isinstance(token.get("token"), str) or not token["token"]:
                problems.append(f"{path}/token has no token text")
            size = token.get("cloud-content-byte")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                problems.append(f"{path}/token: cloud-content-byte is not a byte count")
            elif (size > QUEUE_SIZE_LIMIT) != (queue == "large"):
                problems.append(f"{path}: {size} bytes on the {queue} queue")
            if not isinstance(token.get("delivery-node"), int):
                problems.append(f"{path}/token: delivery-node is not an int")
            name = status.get("status")
            if name not in ACCESS_STATES:
                problems.append(f"{path}/status: {name!r} is not an access state")
                continue
            if not isinstance(status.get("last_modified"), str):
                problems.append(f"{path}/status has no last_modified")
            summary["access"][queue].append(f"{qid}:{name}")
            if name == "Completed":
                metrics["num_assemblies_completed"] += 1
            elif name == "Failed":
                metrics["num_assemblies_failed"] += 1
            elif name != "Deleted":
                metrics["num_assemblies_processing"] += 1
            if name == "Pending" and first_pending is None:
                first_pending = qid
        paused = zk.exists(ACCESS_PAUSE[queue]) is not None
        summary.setdefault("access_paused", {})[queue] = paused
        if first_pending and not paused:
            lock = f"{qdir}/{first_pending}/lock"
            try:
                zk.create(lock, b"", ephemeral=True)
                summary["access_locked"][queue] = first_pending
                zk.delete(lock)
            except NodeExistsError:
                problems.append(f"{lock} is already held")
    summary["access_metrics"] = metrics


def load_json(zk, path, problems):
    if zk.exists(path) is None:
        problems.append(f"{path} is missing")
        return None
    data, _ = zk.get(path)
    try:
        node = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"{path} is not JSON: {e}")
        return None
    if not isinstance(node, dict):
        problems.append(f"{path} is not a JSON object")
        return None
    return node


def check(path, name, item, node, problems, summary):
    if name == "configuration":
        # InitializeConsumer: JSONUtil.getValue(jp, "profile").
        profile = node.get("profile")
        if not isinstance(profile, str) or not profile:
            problems.append(f"{path} has no profile where mrt-ingest looks")
        elif profile != node.get("profile_name"):
            problems.append(f"{path}: profile and profile_name differ")
        else:
            summary["profiles"][item] = profile
        for key in ("type", "submissionDate", "filename", "title", "creator", "responseForm"):
            if not isinstance(node.get(key), str):
                problems.append(f"{path} has no text {key} (mrt-zk's Job getters)")
    elif name == "submission":
        for key in ("profile", "type", "submissionDate", "filename", "title", "creator",
                    "responseForm", "batchID"):
            if not isinstance(node.get(key), str):
                problems.append(f"{path} has no text {key} (the admin tool's batch columns)")
    elif name == "status":
        if not isinstance(node.get("status"), str):
            problems.append(f"{path} has no status")
        if item.startswith("jid") and not isinstance(node.get("retry_count"), int):
            problems.append(f"{path} has no integer retry_count")
    elif name == "store":
        mode = node.get("mode", "")
        parts = mode.split("/")
        if len(parts) != 3:
            problems.append(f"{path}: mode {mode!r} is not action/nodeID/ark")
        else:
            action, node_id, ark = parts
            if action not in ("add", "update"):
                problems.append(f"{path}: action {action!r}")
            try:
                int(node_id)
            except ValueError:
                problems.append(f"{path}: nodeID {node_id!r} is not an int")
            if not urllib.parse.unquote_plus(ark).startswith("ark:/"):
                problems.append(f"{path}: the object id is not an ark")
        if not isinstance(node.get("delete"), str):
            problems.append(f"{path}: delete is not text (the delete list)")
        if not isinstance(node.get("manifest_url"), str):
            problems.append(f"{path}: no manifest_url")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
