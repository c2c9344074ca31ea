"""Ed25519 keys for signed checkpoints, in the text forms of Go's note package (C2SP signed-note).

    verifier = generate_key("ops.key", name="ops.example")   # ops.key (0600) and ops.key.pub
    signer = load_signer("ops.key")                           # refused unless only its owner may read it
    verifier = load_verifier("ops.key.pub")

The private key file is ``PRIVATE+KEY+<name>+<hash>+<base64(0x01 || 32-byte Ed25519 private key)>``
(0600), the public key ``<name>+<hash>+<base64(0x01 || public key)>``, where the hash is the first 4
bytes of SHA-256(name || "\\n" || 0x01 || public key) in hex: Go's ``note.NewSigner`` and
``note.NewVerifier`` read them as they are. A name is 1 to 128 characters, no space, no ``+``.
A private key's bytes never appear in a repr, an error or a log line: a malformed key file is
reported by its size. ``cryptography`` is imported inside the functions that need it only.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
from dataclasses import dataclass

from .errors import InvalidInputError, StoreIOError, StoreKeyError
from .files import read_regular, text_path
from .values import shown

ED25519 = 0x01
MAX_KEY_FILE_BYTES = 1024
MAX_NAME_CHARS = 128
NAME = re.compile(r"[^\s+\x00-\x1f\x7f\u2014]+")


def b64(data: bytes) -> str:
    """Standard base64 of `data`, as text."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes | None:
    """The bytes of standard base64 `text` in its one canonical spelling, or None."""
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    return data if b64(data) == text else None


def _check_name(name: object, field: str) -> str:
    if type(name) is not str or not NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
        raise InvalidInputError(field, f"{field} is invalid: {shown(name)} is not a key name (1 to "
                                       f"{MAX_NAME_CHARS} characters, no space, no '+', no control character)")
    return name


def key_hash(name: str, public: bytes) -> bytes:
    """The 4-byte id of an Ed25519 key named `name`: SHA-256(name || 0x0A || 0x01 || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public).digest()[:4]


@dataclass(frozen=True)
class Verifier:
    """A public key an auditor trusts: its name, its 4-byte key hash and its 32 Ed25519 bytes.

    ``text`` is the Go note verifier key (``name+hash+base64``), what ``FILE.pub`` holds.
    """

    name: str
    hash: bytes
    public: bytes

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """The verifier a ``name+hash+base64(0x01 || key)`` text names; InvalidInputError("trust") when it
        is malformed or its hash is not its name's and key's (a key swapped under a name)."""
        parts = text.strip().split("+", 2)  # base64 may hold a "+"
        data = unb64(parts[2]) if len(parts) == 3 else None
        if (data is None or len(data) != 33 or data[0] != ED25519 or not re.fullmatch(r"[0-9a-f]{8}", parts[1])
                or not NAME.fullmatch(parts[0])):
            raise InvalidInputError("trust", "trust is invalid: not an Ed25519 public key of lifecycle-es keygen "
                                             "(name+hash+base64, as Go's note.NewVerifier reads)")
        if key_hash(parts[0], data[1:]).hex() != parts[1]:
            raise InvalidInputError("trust", f"trust is invalid: the key hash {parts[1]} is not the hash of its "
                                             f"name {parts[0]!r} and key: the key was altered or swapped")
        return cls(parts[0], bytes.fromhex(parts[1]), data[1:])

    @property
    def text(self) -> str:
        """The verifier key as text: ``name+hash+base64(0x01 || public key)``."""
        return f"{self.name}+{self.hash.hex()}+{b64(bytes([ED25519]) + self.public)}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's Ed25519 signature of `message`."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


class Signer:
    """A private key that signs checkpoints. Its bytes never appear in a repr, a message or a log."""

    __slots__ = ("_private", "verifier")

    def __init__(self, name: str, private: bytes) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        _check_name(name, "name")
        if not isinstance(private, bytes) or len(private) != 32:
            raise InvalidInputError("private", "private must be the 32 bytes of an Ed25519 private key")
        self._private = Ed25519PrivateKey.from_private_bytes(private)
        public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.verifier = Verifier(name, key_hash(name, public), public)

    def __repr__(self) -> str:
        return f"Signer({self.verifier.name}+{self.verifier.hash.hex()})"

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of `message`."""
        return self._private.sign(message)


def generate_key(path: str | os.PathLike[str], *, name: str = "lifecycle-es") -> Verifier:
    """Make an Ed25519 key: the private key to `path` (created 0600, never over a file or through a link)
    and the public key to ``<path>.pub``; return the public key. InvalidInputError("path") when either
    exists (a key is never overwritten); StoreIOError when the files cannot be written."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    target = text_path(path, "path")
    _check_name(name, "name")
    for each in (target, target + ".pub"):
        if os.path.lexists(each):
            raise InvalidInputError("path", f"{each!r} exists; a key is never overwritten: choose another name")
    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    signer = Signer(name, raw)
    verifier = signer.verifier
    secret = f"PRIVATE+KEY+{name}+{verifier.hash.hex()}+{b64(bytes([ED25519]) + raw)}\n".encode()
    written: list[str] = []
    try:
        for each, data, mode in ((target, secret, 0o600), (target + ".pub", (verifier.text + "\n").encode(), 0o644)):
            fd = os.open(each, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            written.append(each)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        for each in written:
            with contextlib.suppress(OSError):
                os.unlink(each)
        raise StoreIOError(f"cannot write key {exc.filename or target!r}: {exc.strerror}") from None
    return verifier


def load_signer(path: str | os.PathLike[str]) -> Signer:
    """The signer in the private key file `path` (what `generate_key` wrote).

    The file must be a regular file only its owner may use (mode 0600, as ssh asks of a private key):
    UnsafeFileError otherwise (also an OSError; FileNotFoundError when nothing is there). A malformed
    file is StoreKeyError, reported by its size only: a key's bytes are never echoed.
    """
    name = text_path(path, "path")
    data = read_regular(name, limit=MAX_KEY_FILE_BYTES, what="signing key", private=True)
    parts = data.strip().split(b"+", 4)
    raw = unb64(parts[4].decode("ascii", "replace")) if len(parts) == 5 and parts[:2] == [b"PRIVATE", b"KEY"] else None
    try:
        key_name = parts[2].decode("utf-8") if raw is not None else ""
    except UnicodeDecodeError:
        raw = None
    if raw is None or len(raw) != 33 or raw[0] != ED25519 or not NAME.fullmatch(key_name):
        raise StoreKeyError(f"signing key {name!r} is not a key of lifecycle-es keygen (it holds {len(data)} bytes)")
    signer = Signer(key_name, raw[1:])
    if signer.verifier.hash.hex().encode() != parts[3]:
        raise StoreKeyError(f"signing key {name!r} is damaged: its key hash is not its key's")
    return signer


def load_verifier(path: str | os.PathLike[str]) -> Verifier:
    """The public key in the file `path` (``FILE.pub`` of `generate_key`); see `Verifier.parse`.

    UnsafeFileError (an OSError) for a link, a FIFO or a file larger than a key; FileNotFoundError.
    """
    data = read_regular(text_path(path, "trust"), limit=MAX_KEY_FILE_BYTES, what="public key")
    try:
        return Verifier.parse(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidInputError("trust", f"trust is invalid: {os.fspath(path)!r} is not a public key") from None


__all__ = ["Signer", "Verifier", "b64", "generate_key", "key_hash", "load_signer", "load_verifier",
           "unb64"]
