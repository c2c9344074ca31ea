"""Prometheus metrics of ``lifecycle-es host --metrics ADDR:PORT`` (the only module importing prometheus-client).

    metrics = HostMetrics.serve("127.0.0.1:9464", server)    # an HTTP thread on that address
    log.observers.append(metrics.observe)                    # fed by the host's reports

Exposed, each labelled by runner: ``lifecycle_es_units`` (units by the phase the log records),
``lifecycle_es_leases`` (leases by status), ``lifecycle_es_reconcile_seconds`` (a reconcile pass),
``lifecycle_es_commit_seconds`` (a host lease renewal's write transaction, from BEGIN to durable
COMMIT), ``lifecycle_es_host_lease_token`` and ``lifecycle_es_host_lease_seconds_left`` (by the
driver's local deadline; 0 when not held), ``lifecycle_es_host_fences_total``. Gauges of the log's
state are set from the serving loop's own reports, so a scrape never reads the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from lifecycle_es.errors import InvalidInputError

from .options import ascii_int

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); InvalidInputError naming ``--metrics`` otherwise."""
    host, _, port = text.rpartition(":")
    number = ascii_int(port)
    if not host or number is None or not 0 < number < 65536:
        raise InvalidInputError("--metrics", f"--metrics must be ADDR:PORT (e.g. 127.0.0.1:9464), got {text!r}")
    return host.strip("[]"), number


class _Leases(Collector):
    """The host leases as the keepers hold them, read at each scrape (no store access)."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        token = GaugeMetricFamily("lifecycle_es_host_lease_token", "The host lease token this driver holds "
                                  "(0: a standby)", labels=["runner"])
        left = GaugeMetricFamily("lifecycle_es_host_lease_seconds_left", "Seconds until the driver's local "
                                 "deadline (0 when not held or fenced)", labels=["runner"])
        fences = CounterMetricFamily("lifecycle_es_host_fences", "Host leases this driver lost", labels=["runner"])
        for keeper in self._server.keepers:
            grant = keeper.grant
            token.add_metric([keeper.runner_id], grant.token if grant is not None else 0)
            left.add_metric([keeper.runner_id], keeper.seconds_left())
            fences.add_metric([keeper.runner_id], keeper.fences)
        yield from (token, left, fences)


class HostMetrics:
    """The host's metrics registry and its HTTP endpoint."""

    def __init__(self, server: Any) -> None:
        self.registry = CollectorRegistry()
        self.units = Gauge("lifecycle_es_units", "Units by the phase the log records", ["runner", "state"],
                           registry=self.registry)
        self.leases = Gauge("lifecycle_es_leases", "Leases by status", ["runner", "status"], registry=self.registry)
        self.reconcile = Histogram("lifecycle_es_reconcile_seconds", "Duration of a reconcile pass", ["runner"],
                                   buckets=_BUCKETS, registry=self.registry)
        self.commit = Histogram("lifecycle_es_commit_seconds", "Latency of a host lease renewal's commit",
                                ["runner"], buckets=_BUCKETS, registry=self.registry)
        self.registry.register(_Leases(server))
        self._http: Any = None

    @classmethod
    def serve(cls, address: str, server: Any) -> HostMetrics:
        """Metrics for `server`, served on `address` (``HOST:PORT``) from a thread."""
        host, port = parse_address(address)
        metrics = cls(server)
        metrics._http, _ = start_http_server(port, addr=host, registry=metrics.registry)
        return metrics

    def observe(self, kind: str, fields: dict[str, Any]) -> None:
        """Fold one host report into the metrics."""
        runner = str(fields.get("runner", ""))
        if kind == "reconciled":
            self.reconcile.labels(runner).observe(fields["seconds"])
            for name, gauge in (("units", self.units), ("leases", self.leases)):
                for labels in list(gauge._metrics):  # a state that emptied reads 0, not its last count
                    if labels[0] == runner:
                        gauge.labels(*labels).set(0)
                for state, count in fields.get(name, {}).items():
                    gauge.labels(runner, state).set(count)
        elif kind == "renewed":
            self.commit.labels(runner).observe(fields["seconds"])

    def close(self) -> None:
        """Stop serving."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()


__all__ = ["HostMetrics", "parse_address"]
