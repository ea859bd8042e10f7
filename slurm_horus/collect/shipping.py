"""Shipping sample batches over the network: the wire contract and the collector's side.

``horus collect --ship-to http://head:8910`` POSTs its spooled batches to ``horus receive``:

    POST /v1/batches HTTP/1.1
    Content-Type: application/x-ndjson
    Content-Length: N                    (at most MAX_BODY_BYTES)
    X-Horus-Credential: MUNGE:...        (a munge credential, see below)

    {"node": "n1", "ts": ..., "gpus": [...], "jobs": [...]}      one batch per line (the spool's rows)

The credential's payload is one line, ``horus-ship/1 node=NAME bytes=N sha256=HEX``: the node the
batches are of and the digest of exactly this body. munged adds who encoded it (uid) and from which
host (its origin address); it decodes once and only within its TTL. So the receiver knows that the
body is the one the node's collector sent, which node it claims, and where it came from; it stores a
body only when that host may speak for that node (``receiver.py``).

Replies are one JSON object: ``{"ok": true, "batches": k, "rows": r, "new_rows": n}`` (200) or
``{"ok": false, "error": "..."}`` (4xx: refused, 5xx: try again later). A batch is marked shipped in
the spool only after a 200, which the receiver sends only after its transaction committed, and the
store ignores rows it already holds, so a batch sent twice (a kill between "stored" and "marked
shipped", a reply lost on the way) is stored once.
"""

import hashlib
import http.client
import json
import re
import socket
from urllib.parse import urlsplit

from ..errors import InputError
from . import munge

PATH = "/v1/batches"
PING_PATH = "/v1/ping"
CREDENTIAL_HEADER = "X-Horus-Credential"
PAYLOAD_VERSION = "horus-ship/1"
MAX_BODY_BYTES = 8 << 20
TARGET_BODY_BYTES = 2 << 20  # the collector splits its spool into requests of about this size
_PAYLOAD = re.compile(r"^horus-ship/1 node=(?P<node>[A-Za-z0-9._-]{1,64}) bytes=(?P<bytes>\d{1,10}) "
                      r"sha256=(?P<sha>[0-9a-f]{64})$")


class ShipError(Exception):
    """Shipping failed; the batches stay in the spool. ``permanent``: the receiver refused them."""

    def __init__(self, message, permanent=False):
        super().__init__(message)
        self.permanent = permanent


def credential_payload(node, body):
    return f"{PAYLOAD_VERSION} node={node} bytes={len(body)} sha256={hashlib.sha256(body).hexdigest()}".encode()


def parse_payload(payload):
    """(node, bytes, sha256 hex) of a credential payload; ValueError when it is not ours."""
    try:
        text = payload.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("credential payload is not a shipping claim") from None
    match = _PAYLOAD.match(text)
    if not match:
        raise ValueError("credential payload is not a shipping claim")
    return match.group("node"), int(match.group("bytes")), match.group("sha")


def parse_url(url):
    """``http://host:port[/prefix]`` -> (scheme, host, port, path prefix); InputError otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InputError(f"--ship-to {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--ship-to {url!r}: expected http://HOST:PORT")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), parts.path.rstrip("/")


def _requests(batches):
    """Split batches into request bodies per node, each at most about TARGET_BODY_BYTES."""
    by_node = {}
    for batch in batches:
        by_node.setdefault(str(batch.get("node")), []).append(batch)
    for node, items in by_node.items():
        lines, size = [], 0
        for batch in items:
            line = json.dumps(batch, separators=(",", ":")).encode() + b"\n"
            if lines and size + len(line) > TARGET_BODY_BYTES:
                yield node, b"".join(lines)
                lines, size = [], 0
            lines.append(line)
            size += len(line)
        if lines:
            yield node, b"".join(lines)


class NetworkShipper:
    """Delivers batches to a receiver; ``deliver`` raises :class:`ShipError` unless all were stored."""

    def __init__(self, url, munge_socket=None, timeout_s=30.0):
        self.scheme, self.host, self.port, self.prefix = parse_url(url)
        self.url = url
        self.munge_socket = munge_socket or None
        self.timeout_s = timeout_s

    def _connection(self):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout_s)

    def post(self, node, body):
        """One request; returns the reply dict of a 200, raises ShipError otherwise."""
        if len(body) > MAX_BODY_BYTES:
            raise ShipError(f"a batch of {len(body)} bytes is over the receiver's limit", permanent=True)
        try:
            credential = munge.encode(credential_payload(node, body), self.munge_socket)
        except munge.MungeError as exc:
            raise ShipError(f"cannot make a munge credential: {exc}") from None
        conn = self._connection()
        try:
            conn.request("POST", self.prefix + PATH, body=body, headers={
                "Content-Type": "application/x-ndjson", CREDENTIAL_HEADER: credential})
            response = conn.getresponse()
            text = response.read(65536)
        except (OSError, http.client.HTTPException) as exc:
            raise ShipError(f"receiver {self.url} unreachable: {exc}") from None
        finally:
            conn.close()
        try:
            reply = json.loads(text)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ShipError(f"receiver {self.url}: HTTP {response.status} without a JSON reply")
        if response.status != 200 or reply.get("ok") is not True:
            error = str(reply.get("error") or "refused")[:300]
            raise ShipError(f"receiver {self.url} refused the batches (HTTP {response.status}): {error}",
                            permanent=400 <= response.status < 500)
        return reply

    def deliver(self, batches):
        stored = 0
        for node, body in _requests(batches):
            stored += int(self.post(node, body).get("rows") or 0)
        return stored

    def ping(self):
        conn = self._connection()
        try:
            conn.request("GET", self.prefix + PING_PATH)
            response = conn.getresponse()
            return response.status == 200 and json.loads(response.read(65536)).get("ok") is True
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            return False
        finally:
            conn.close()


def receiver_reachable(url, timeout_s=1.0):
    try:
        return NetworkShipper(url, timeout_s=timeout_s).ping()
    except (InputError, socket.error):
        return False
