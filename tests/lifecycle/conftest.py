"""The runner lifecycle: every rule, refused inputs, unit facts, time, the stateful machine against the
model, concurrency between real processes, and the property-testing kit."""
