"""The throwaway PostgreSQL cluster the tests run on: `benchmarks.cluster`, shared with the PostgreSQL
benchmark (the tests name it through this module, as they always have)."""

from benchmarks.cluster import NEED, Server, binaries, cluster

__all__ = ["NEED", "Server", "binaries", "cluster"]
