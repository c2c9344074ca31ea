"""Value strategies: identifiers, digests, resource limits and fresh proxy authorities within the original's bounds."""

from __future__ import annotations

from hypothesis import strategies as st

from ..canonical import iso_ms
from ..values import ProxyAuthority, Resources
from .bounds import _ID_CHARS, _ID_FIRST, MAX_PROXY_AGE_MS, MAX_PROXY_SKEW_MS, MIB


def ids(*, max_size: int = 32) -> st.SearchStrategy[str]:
    """Identifiers within the original's pattern (1..`max_size` characters, at most 256)."""
    rest = st.text(alphabet=_ID_CHARS, max_size=min(max_size, 256) - 1)
    return st.builds(str.__add__, st.sampled_from(_ID_FIRST), rest)


def digests() -> st.SearchStrategy[str]:
    """``sha256:<64 lowercase hex>`` digests."""
    return st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex())


def resources() -> st.SearchStrategy[Resources]:
    """Resource limits within the original's bounds (1..86400 CPU seconds, 64 MiB..64 GiB)."""
    return st.builds(Resources, cpu_seconds=st.integers(1, 86_400),
                     memory_bytes=st.integers(64 * MIB, 64 * 1024 * MIB))


def proxy_authorities(now_ms: int, *, id: str | st.SearchStrategy[str] | None = None,
                      min_revision: int = 1, max_revision: int | None = None) -> st.SearchStrategy[ProxyAuthority]:
    """Proxy authorities fresh at `now_ms`: issued at most 5 min before and 30 s after it, not expired.

    `id`: a fixed id, a strategy, or None for `ids()`. Revisions lie in ``min_revision..max_revision``
    (default: up to ``min_revision + 8``).
    """
    id_strategy = ids(max_size=24) if id is None else id if isinstance(id, st.SearchStrategy) else st.just(id)
    low = max(1, min_revision)
    return st.builds(
        ProxyAuthority,
        id=id_strategy,
        revision=st.integers(low, max(low, max_revision if max_revision is not None else low + 8)),
        issued_at=st.integers(max(0, now_ms - MAX_PROXY_AGE_MS), now_ms + MAX_PROXY_SKEW_MS).map(iso_ms),
        expires_at=st.integers(now_ms + 1, now_ms + 24 * 60 * 60 * 1000).map(iso_ms),
    )
