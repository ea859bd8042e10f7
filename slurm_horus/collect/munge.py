"""MUNGE credentials through ``libmunge`` (ctypes): who sent a batch of samples, and from which host.

Every Slurm site runs munged on every node with one shared key; a credential encoded on a node
carries the encoding process's uid/gid and the node's address (munged's ``--origin``, by default
the address its host name resolves to), and decodes only once (munged refuses a replay) and only
within its TTL. The collector encodes a small payload naming its node and the SHA-256 of the body
it sends; the receiver decodes it, checks the body against the digest and the node against the
origin address (see ``receiver.py``).

libmunge is the ``libmunge2`` package, a dependency of ``munge``; calling it costs a round trip to
the local munged and no process start (``unmunge`` as a subprocess costs ~3 ms per request, which at
a thousand nodes is the receiver's largest cost).
"""

import ctypes
import ctypes.util
import socket
import struct
import threading
from dataclasses import dataclass

# enum munge_opt (munge.h, stable since 0.5)
_OPT_ADDR4 = 5
_OPT_ENCODE_TIME = 6
_OPT_SOCKET = 8
_OPT_TTL = 4
# munge_err_t values the receiver tells apart
EMUNGE_SOCKET = 6
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17

MAX_CREDENTIAL_BYTES = 4096  # a credential for a ~100-byte payload is ~250 bytes


class MungeError(Exception):
    """A credential could not be made or checked; ``code`` is munge's error number."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


@dataclass
class Credential:
    payload: bytes
    uid: int
    gid: int
    origin: str  # IPv4 address of the host that encoded it (dotted quad)
    encoded_at: int


_lib = None
_libc = None
_lock = threading.Lock()


def _load():
    global _lib, _libc
    with _lock:
        if _lib is None:
            name = ctypes.util.find_library("munge") or "libmunge.so.2"
            try:
                lib = ctypes.CDLL(name)
            except OSError as exc:
                raise MungeError(f"libmunge is not installed ({exc}); install the munge package") from None
            lib.munge_ctx_create.restype = ctypes.c_void_p
            lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_destroy.restype = None
            lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_char_p,
                                         ctypes.c_int]
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_uint32)]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_strerror.restype = ctypes.c_char_p
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_strerror.restype = ctypes.c_char_p
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.free.argtypes = [ctypes.c_void_p]
            libc.free.restype = None
            _lib, _libc = lib, libc
    return _lib


def available():
    try:
        _load()
    except MungeError:
        return False
    return True


class _Context:
    def __init__(self, socket_path):
        self.lib = _load()
        self.ctx = self.lib.munge_ctx_create()
        if not self.ctx:
            raise MungeError("munge_ctx_create failed")
        if socket_path:
            # munge_ctx_set is variadic: the socket option takes one char *
            self._path = ctypes.c_char_p(str(socket_path).encode())
            err = self.lib.munge_ctx_set(ctypes.c_void_p(self.ctx), ctypes.c_int(_OPT_SOCKET), self._path)
            if err:
                self.close()
                raise MungeError(f"munge socket {socket_path}: {self.lib.munge_strerror(err).decode()}", err)

    def error(self, err):
        text = self.lib.munge_ctx_strerror(self.ctx)
        return (text or self.lib.munge_strerror(err)).decode(errors="replace")

    def get_int(self, opt, ctype):
        value = ctype()
        err = self.lib.munge_ctx_get(ctypes.c_void_p(self.ctx), ctypes.c_int(opt), ctypes.byref(value))
        return None if err else value

    def close(self):
        if self.ctx:
            self.lib.munge_ctx_destroy(self.ctx)
            self.ctx = None


def encode(payload, socket_path=None):
    """A credential (text) carrying ``payload`` (bytes), made by the munged at ``socket_path``."""
    ctx = _Context(socket_path)
    try:
        cred = ctypes.c_char_p()
        err = ctx.lib.munge_encode(ctypes.byref(cred), ctx.ctx, payload, len(payload))
        if err:
            raise MungeError(f"munge encode failed: {ctx.error(err)}", err)
        try:
            return ctypes.string_at(cred).decode("ascii")
        finally:
            _libc.free(cred)
    finally:
        ctx.close()


def decode(credential, socket_path=None):
    """Check ``credential`` (text) with the munged at ``socket_path``; a :class:`Credential`.

    Raises :class:`MungeError` for anything munged refuses (bad, expired, replayed, other key).
    """
    if isinstance(credential, str):
        credential = credential.encode("ascii", errors="replace")
    if not credential or len(credential) > MAX_CREDENTIAL_BYTES or b"\0" in credential:
        raise MungeError("malformed credential")
    ctx = _Context(socket_path)
    try:
        buf = ctypes.c_void_p()
        length = ctypes.c_int()
        uid = ctypes.c_uint32()
        gid = ctypes.c_uint32()
        err = ctx.lib.munge_decode(credential, ctx.ctx, ctypes.byref(buf), ctypes.byref(length),
                                   ctypes.byref(uid), ctypes.byref(gid))
        try:
            payload = ctypes.string_at(buf, length.value) if buf.value else b""
        finally:
            if buf.value:
                _libc.free(buf)
        if err:
            raise MungeError(f"credential refused: {ctx.error(err)}", err)
        addr = ctx.get_int(_OPT_ADDR4, ctypes.c_uint32)
        when = ctx.get_int(_OPT_ENCODE_TIME, ctypes.c_long)
        origin = socket.inet_ntoa(struct.pack("=I", addr.value)) if addr is not None else ""
        return Credential(payload, uid.value, gid.value, origin, when.value if when is not None else 0)
    finally:
        ctx.close()
