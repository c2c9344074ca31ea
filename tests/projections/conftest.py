"""The read side: folds, fleet view, snapshots, read models, rebuild, and the incident timeline."""
