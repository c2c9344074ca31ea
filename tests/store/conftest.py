"""The event store: append, read, chain, seal, schema, files, disk faults and power loss, hostile files,
and the backend contract every backend passes."""
