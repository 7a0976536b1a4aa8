"""The loopback web control plane: an operator API and one page over the same records as
the CLI. It reads the database and local files only, and acts through the scheduler's own
controls; it is not a second workflow engine."""
