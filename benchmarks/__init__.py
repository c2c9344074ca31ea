"""Runnable benchmarks of lifecycle-es, each printing ratios against a baseline measured in the same run.

``python -m benchmarks`` runs them all (``--quick`` in under two minutes: what ``make bench`` runs);
``python -m benchmarks.store`` or ``python -m benchmarks.lifecycle`` runs one. The modules generate their
own data in a scratch directory. Shared measurement code is in `benchmarks.measure`, the baselines in
`benchmarks.baselines`, the generation of long logs in `benchmarks.history`. ``python -m benchmarks.postgres``
runs on a throwaway PostgreSQL cluster of its own (`benchmarks.cluster`, which the tests use too); the
full suite runs it (``--quick`` only with ``--only postgres``), and reports it n/a where the machine has
no server binaries.
"""
