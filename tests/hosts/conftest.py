"""The host drivers: child processes and systemd units for real, run directories, parking, hostile units."""
