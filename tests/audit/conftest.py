"""The audit as a library call, and the worker processes it shares its pass with."""
