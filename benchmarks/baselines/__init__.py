"""What our figures are measured against, each re-created here so that it runs in the same process.

- `raw_sqlite`: apsw with the store's pragma profile and a table shaped like ours, with no chain and no
  lifecycle: the floor a durable SQLite append cannot go below, and a bare replay loop.
- `json_store`: the seed's storage approach, one JSON file per runner rewritten under a lock per command.
- `pyeventsourcing`: the ``eventsourcing`` library (PyPI 9.x) on its SQLite (or PostgreSQL) persistence module.
- `raw_postgres`: psycopg on the same server as the store, a table shaped like ours: an autocommit INSERT,
  a binary COPY, and a raw NOTIFY seen by a raw LISTEN.
"""
