"""Which backend a store's target names, and opening it: a path is an SQLite file, a ``postgresql://`` (or
``postgres://``) URL a schema on a PostgreSQL server.

A URL is a libpq connection URI with two parameters of this library's own, taken out before libpq sees
it: ``schema`` (the schema that holds the store, default ``lifecycle_es``) and ``notify`` (``off`` stops
appends from sending NOTIFY: followers then poll). A URL's password is never shown: `shown_target`
masks it, and a backend's `path` is the URL with it masked. The PostgreSQL driver (psycopg, the
``postgres`` extra) is imported only when a URL is opened.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

from .backend import Backend, Row
from .errors import InvalidInputError
from .values import shown

URL_SCHEMES = ("postgresql://", "postgres://")
DEFAULT_SCHEMA = "lifecycle_es"
# A schema name as the store writes it unquoted: it also names the NOTIFY channel (63 bytes at most), so
# it is kept short enough for the channel's prefix.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
_OFF = {"off", "0", "false", "no"}
_ON = {"on", "1", "true", "yes"}


def is_url(target: str) -> bool:
    """Whether `target` names a PostgreSQL store (a ``postgresql://`` or ``postgres://`` URL), not a file."""
    return target.startswith(URL_SCHEMES)


@dataclass(frozen=True, slots=True)
class ServerTarget:
    """A PostgreSQL store's address: what libpq connects to, and this library's own parameters."""

    conninfo: str = field(repr=False)
    """The URL as libpq reads it (this library's parameters removed; it may hold a password, so it is
    left out of the repr)."""
    schema: str
    """The schema that holds the store."""
    notify: bool
    """Whether appends send NOTIFY (followers wake at once) or not (followers poll)."""
    shown: str
    """The URL with its password masked (this library's parameters kept, so it names the same store):
    what messages and `Backend.path` show."""


def server_target(url: str) -> ServerTarget:
    """Parse a store URL (InvalidInputError naming ``path`` for a malformed one or a bad parameter)."""
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidInputError("path", f"path {shown(mask_password(url))} is not a valid URL ({exc})") from None
    schema, notify, kept = DEFAULT_SCHEMA, True, []
    # The parameters libpq reads are passed on as they were written (only this library's are taken out).
    raw = [part for part in parts.query.split("&") if part]
    for (name, value), written in zip(query, raw, strict=True):
        if name == "schema":
            if not _SCHEMA_NAME.fullmatch(value):
                raise InvalidInputError("path", f"the URL's schema {shown(value)} is not a schema name the "
                                                "store uses (lower-case letters, digits and _, at most 48, not "
                                                "first a digit)")
            schema = value
        elif name == "notify":
            if value.lower() not in _OFF | _ON:
                raise InvalidInputError("path", f"the URL's notify {shown(value)} is invalid (use on or off)")
            notify = value.lower() in _ON
        else:
            kept.append(written)
    conninfo = urllib.parse.urlunsplit(parts._replace(query="&".join(kept)))
    return ServerTarget(conninfo, schema, notify, mask_password(url))


def target_url(target: ServerTarget) -> str:
    """A URL that opens `target` again, its password and all (never to be shown: see `ServerTarget.shown`)."""
    parts = urllib.parse.urlsplit(target.conninfo)
    own = urllib.parse.urlencode({"schema": target.schema, "notify": "on" if target.notify else "off"})
    return urllib.parse.urlunsplit(parts._replace(query="&".join(part for part in (parts.query, own) if part)))


# The parameters libpq reads a secret from: the password, and the one that unlocks the client's SSL key.
_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def _secret_parameter(part: str) -> bool:
    """Whether the query part ``name=value`` gives a secret (libpq decodes the name as it does the value)."""
    return urllib.parse.unquote(part.partition("=")[0]) in _SECRET_PARAMETERS


def _masked_query(query: str) -> str:
    """`query` with each secret parameter's value replaced by ``***``."""
    return "&".join(f"{part.partition('=')[0]}=***" if _secret_parameter(part) else part for part in query.split("&"))


def mask_password(url: str) -> str:
    """`url` with the password of its user part (and a ``password`` or ``sslpassword`` parameter, however its
    name is spelt) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # unsplittable (a bracket left open): mask by its text, the user part and each parameter
        start, mark, query = re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url).partition("?")
        return start + mark + _masked_query(query)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = f"{user}@{host}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=_masked_query(parts.query)))


def url_secrets(url: str) -> list[str]:
    """The secrets `url` holds (its user part's password, its secret parameters' values), each as written and
    as decoded, longest first: what a message quoting the URL's pieces (libpq's do) must not show."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return []
    found = []
    user = parts.netloc.rpartition("@")[0]
    if ":" in user:
        found.append(user.split(":", 1)[1])
    found += [part.partition("=")[2] for part in parts.query.split("&") if _secret_parameter(part)]
    return sorted({each for value in found for each in (value, urllib.parse.unquote(value)) if each},
                  key=len, reverse=True)


def has_password(url: str) -> bool:
    """Whether `url` carries a password (in its user part or as a ``password`` or ``sslpassword`` parameter)."""
    return mask_password(url) != url


def open_backend(target: str, *, durability: str = "full", busy_timeout_ms: int = 5000, vfs: str | None = None,
                 read_only: bool = False) -> Backend:
    """The backend for `target`: SQLite for a path, PostgreSQL for a URL (`vfs` applies to SQLite only)."""
    if is_url(target):
        if vfs is not None:
            raise InvalidInputError("vfs", "vfs is an SQLite setting: a PostgreSQL store takes none")
        from .postgres import PostgresBackend

        return PostgresBackend(server_target(target), durability=durability, busy_timeout_ms=busy_timeout_ms,
                               read_only=read_only)
    from .sqlite import SqliteBackend

    return SqliteBackend(target, durability=durability, busy_timeout_ms=busy_timeout_ms, vfs=vfs,
                         read_only=read_only)


def create_store(target: str, *, store_id: bytes, key_id: str | None, rows: Iterable[Row]) -> None:
    """Create a new store at `target` holding `rows` exactly, under the given store id and key id (for
    ``lifecycle-es import``): all of them or none; a store already there raises StoreIOError, untouched."""
    if is_url(target):
        from .postgres_schema import create_server_store

        create_server_store(server_target(target), store_id=store_id, key_id=key_id, rows=rows)
        return
    from .sqlite_files import create_store as create_file_store

    create_file_store(target, store_id=store_id, key_id=key_id, rows=rows)


def store_exists(target: str) -> bool:
    """Whether something is at `target`: a file (or link) at the path, or a store in the URL's schema."""
    if is_url(target):
        from .postgres_schema import connect
        from .postgres_schema import store_exists as schema_holds_store

        parsed = server_target(target)
        with connect(parsed) as conn:
            return schema_holds_store(conn, parsed.schema)
    import os

    return os.path.lexists(target)


def remove_store(target: str) -> None:
    """Remove a store `create_store` made (an import that failed its check): the file and its -wal/-shm,
    or the server's schema."""
    if is_url(target):
        from .postgres_schema import drop_server_store

        drop_server_store(server_target(target))
        return
    import contextlib
    import os

    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.unlink(target + suffix)
