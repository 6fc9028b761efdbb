#!/usr/bin/env python3
"""tools/audit-verify.py: an independent verifier of ingest's audit files.

Checks an audit bundle (`ingest audit export`) or a consistency proof
(`ingest audit prove`) with nothing but this file, Python's standard library
and PyPI's `cryptography` (for Ed25519). It shares no code with the Rust
verifier (`ingest audit verify`): BLAKE3 (the record hash) is implemented
here from its specification, the Merkle checks from RFC 9162.

    tools/audit-verify.py FILE [--key PUB.pem]

Exit 0 when the file verifies; 1 with one line per failure, each starting
with what failed: `format`, `event at position N`, `proof of …`,
`signature …`, `head …`, `public key …`; 2 on a usage error.
"""
import hashlib
import json
import struct
import sys

BUNDLE_FORMAT = "ingest-audit-bundle-1"
CONSISTENCY_FORMAT = "ingest-consistency-proof-1"
TREE_HEAD_CONTEXT = b"ingest tree head v1\n"
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_PROOF_NODES = 64

# ---------------------------------------------------------------------------
# BLAKE3 (hash mode, 32-byte output), from the specification
# ---------------------------------------------------------------------------

_IV = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
       0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
_PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
_CHUNK_START, _CHUNK_END, _PARENT, _ROOT = 1, 2, 4, 8
_M = 0xFFFFFFFF


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & _M
    v = s[d] ^ s[a]
    s[d] = ((v >> 16) | (v << 16)) & _M
    s[c] = (s[c] + s[d]) & _M
    v = s[b] ^ s[c]
    s[b] = ((v >> 12) | (v << 20)) & _M
    s[a] = (s[a] + s[b] + y) & _M
    v = s[d] ^ s[a]
    s[d] = ((v >> 8) | (v << 24)) & _M
    s[c] = (s[c] + s[d]) & _M
    v = s[b] ^ s[c]
    s[b] = ((v >> 7) | (v << 25)) & _M


def _compress(cv, words, counter, block_len, flags):
    s = list(cv) + _IV[:4] + [counter & _M, (counter >> 32) & _M, block_len, flags]
    m = list(words)
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in _PERM]
    return [s[i] ^ s[i + 8] for i in range(8)]


def _words(block):
    return struct.unpack("<16I", block.ljust(64, b"\0"))


def _chunk_output(data, counter):
    """The last compression's inputs of one chunk (at most 1024 bytes)."""
    blocks = [data[i:i + 64] for i in range(0, len(data), 64)] or [b""]
    cv = _IV
    for i, block in enumerate(blocks[:-1]):
        flags = _CHUNK_START if i == 0 else 0
        cv = _compress(cv, _words(block), counter, 64, flags)
    last = blocks[-1]
    flags = _CHUNK_END | (_CHUNK_START if len(blocks) == 1 else 0)
    return (cv, _words(last), counter, len(last), flags)


def _output(data, counter):
    if len(data) <= 1024:
        return _chunk_output(data, counter)
    left_len = 1024
    while left_len * 2 < len(data):
        left_len *= 2
    left = _compress(*_output(data[:left_len], counter))
    right = _compress(*_output(data[left_len:], counter + left_len // 1024))
    return (_IV, tuple(left + right), 0, 64, _PARENT)


def blake3(data):
    cv, words, counter, block_len, flags = _output(data, 0)
    return struct.pack("<8I", *_compress(cv, words, counter, block_len, flags | _ROOT))


# ---------------------------------------------------------------------------
# RFC 9162 Merkle checks (SHA-256)
# ---------------------------------------------------------------------------

def leaf_hash(record_hash):
    return hashlib.sha256(b"\x00" + record_hash).digest()


def node_hash(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_inclusion(leaf, index, size, proof, root):
    """None when it holds, else why not (RFC 9162 2.1.3.2)."""
    if index >= size:
        return f"leaf {index} is not in a tree of {size} leaves"
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return "the proof has the wrong length for these tree sizes"
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        return "the proof has the wrong length for these tree sizes"
    if r != root:
        return f"the proof leads to root {r.hex()}, not {root.hex()}"
    return None


def verify_consistency(first, second, first_root, second_root, proof):
    """None when it holds, else why not (RFC 9162 2.1.4.2)."""
    if first > second:
        return f"the old tree ({first} leaves) is larger than the new one ({second})"
    if first == second:
        if proof:
            return "the proof has the wrong length for these tree sizes"
        return None if first_root == second_root else "equal sizes, different roots"
    if first == 0:
        return None if not proof else "the proof has the wrong length for these tree sizes"
    if not proof:
        return "the proof has the wrong length for these tree sizes"
    path = ([first_root] if first & (first - 1) == 0 else []) + list(proof)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return "the proof has the wrong length for these tree sizes"
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        return "the proof has the wrong length for these tree sizes"
    if fr != first_root:
        return f"the proof leads to old root {fr.hex()}, not {first_root.hex()}"
    if sr != second_root:
        return f"the proof leads to root {sr.hex()}, not {second_root.hex()}"
    return None


# ---------------------------------------------------------------------------
# The files
# ---------------------------------------------------------------------------

class Bad(Exception):
    """A value of the wrong form (a format failure)."""


def unhex(text, what, length=None):
    if not isinstance(text, str):
        raise Bad(f"{what} is not a string")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise Bad(f"{what} is not hex") from None
    if length is not None and len(raw) != length:
        raise Bad(f"{what} is {len(raw)} bytes, expected {length}")
    return raw


def varint(data, at):
    """A bincode (standard configuration) unsigned varint at `at`."""
    if at >= len(data):
        raise Bad("the header ends early")
    tag = data[at]
    if tag < 251:
        return tag, at + 1
    width = {251: 2, 252: 4, 253: 8}.get(tag)
    if width is None or at + 1 + width > len(data):
        raise Bad("the header has a bad varint")
    return int.from_bytes(data[at + 1:at + 1 + width], "little"), at + 1 + width


def header_position(header):
    """The header's position: its second field, after the schema version."""
    _, at = varint(header, 0)
    position, _ = varint(header, at)
    return position


def fingerprint(key):
    import base64
    return "SHA256:" + base64.b64encode(hashlib.sha256(key).digest()).decode().rstrip("=")


def signature_holds(key, signature, tree_size, root):
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    message = TREE_HEAD_CONTEXT + struct.pack(">Q", tree_size) + root
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
        return True
    except (InvalidSignature, ValueError):
        return False


def head_of(head):
    if not isinstance(head, dict):
        raise Bad("a head is not an object")
    size = head.get("tree_size")
    if not isinstance(size, int) or size < 0:
        raise Bad("a head's tree_size is not a count")
    return (size, unhex(head.get("root"), "the head's root", 32),
            unhex(head.get("public_key"), "the head's public key", 32),
            unhex(head.get("signature"), "the head's signature"))


def nodes_of(proof):
    if not isinstance(proof, list) or len(proof) > MAX_PROOF_NODES:
        raise Bad("not a list of at most 64 nodes")
    return [unhex(n, f"node {i}", 32) for i, n in enumerate(proof)]


def check_bundle(doc, pinned):
    failures = []
    size, root, key, signature = head_of(doc.get("head"))
    if pinned is not None and pinned != key:
        return [f"public key of the signed head: signed by {fingerprint(key)}, "
                f"not by the given key {fingerprint(pinned)}"]
    signed = signature_holds(key, signature, size, root)
    events = doc.get("events")
    if not isinstance(events, list) or not events:
        return ["format: the bundle has no events"]
    proofs_failed = 0
    previous = 0
    for e in events:
        position = e.get("position") if isinstance(e, dict) else None
        if not isinstance(position, int) or position <= previous:
            failures.append(f"event at position {position}: positions must rise; it follows {previous}")
            continue
        previous = position
        try:
            header = unhex(e.get("header"), "the header")
            kind = e.get("kind")
            if not isinstance(kind, str):
                raise Bad("the kind is not a string")
            payload = unhex(e.get("payload"), "the payload")
            stated = unhex(e.get("hash"), "the hash", 32)
            kind_bytes = kind.encode()
            computed = blake3(header + struct.pack("<Q", len(kind_bytes)) + kind_bytes + payload)
            if computed != stated:
                raise Bad(f"its bytes hash to {computed.hex()}, the bundle says {stated.hex()}")
            claimed = header_position(header)
            if claimed != position:
                raise Bad(f"its header says position {claimed}")
        except Bad as why:
            failures.append(f"event at position {position}: {why}")
            continue
        try:
            proof = nodes_of(e.get("proof"))
            why = verify_inclusion(leaf_hash(stated), position - 1, size, proof, root)
        except Bad as bad:
            why = str(bad)
        if why:
            proofs_failed += 1
            failures.append(f"proof of the event at position {position}: {why}")
    if not signed:
        if proofs_failed and proofs_failed == len(events):
            failures = [f for f in failures if not f.startswith("proof ")]
            failures.insert(0, "head (signed): the signature does not cover this tree size and "
                               "root, and no proof reaches the root: the head was changed")
        else:
            failures.insert(0, f"signature of the signed head: does not verify with key "
                               f"{fingerprint(key)} over tree size {size}")
    return failures


def check_consistency(doc, pinned):
    failures = []
    heads = {}
    for which in ("from", "to"):
        size, root, key, signature = head_of(doc.get(which))
        heads[which] = (size, root, key)
        if pinned is not None and pinned != key:
            failures.append(f"public key of the {which} head: signed by {fingerprint(key)}, "
                            f"not by the given key {fingerprint(pinned)}")
        elif not signature_holds(key, signature, size, root):
            failures.append(f"signature of the {which} head: does not verify with key "
                            f"{fingerprint(key)} over tree size {size}")
    if heads["from"][2] != heads["to"][2]:
        failures.append("public key of the to head: the two heads were signed by different keys")
    try:
        proof = nodes_of(doc.get("proof"))
        why = verify_consistency(heads["from"][0], heads["to"][0],
                                 heads["from"][1], heads["to"][1], proof)
    except Bad as bad:
        why = str(bad)
    if why:
        failures.append(f"proof of consistency: {why}")
    return failures


def public_key_from_pem(path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding, PublicFormat, load_pem_public_key)
    with open(path, "rb") as f:
        text = f.read(64 * 1024)
    # `ingest keys show` prints a `# fingerprint` line before the PEM.
    at = text.find(b"-----BEGIN")
    key = load_pem_public_key(text[at:] if at >= 0 else text)
    if not isinstance(key, Ed25519PublicKey):
        raise SystemExit(f"audit-verify: {path} is not an Ed25519 public key")
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def main(argv):
    args = list(argv)
    pinned = None
    if "--key" in args:
        i = args.index("--key")
        if i + 1 >= len(args):
            print("usage: audit-verify.py FILE [--key PUB.pem]", file=sys.stderr)
            return 2
        pinned = public_key_from_pem(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: audit-verify.py FILE [--key PUB.pem]", file=sys.stderr)
        return 2
    with open(args[0], "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        print(f"format: larger than {MAX_FILE_BYTES} bytes")
        return 1
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise Bad("not a JSON object")
        fmt = doc.get("format")
        if fmt == BUNDLE_FORMAT:
            failures = check_bundle(doc, pinned)
        elif fmt == CONSISTENCY_FORMAT:
            failures = check_consistency(doc, pinned)
        else:
            raise Bad(f"unknown format; expected {BUNDLE_FORMAT} or {CONSISTENCY_FORMAT}")
    except (ValueError, Bad) as why:
        failures = [f"format: {str(why)[:200]}"]
    for f in failures:
        print(f)
    if failures:
        print(f"FAILED: {len(failures)} problem(s)")
        return 1
    print(f"ok: {doc['format']} verifies")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
