"""The ``lifecycle-es`` command line, driven as an operator would: the real console script in a child process."""
