"""aiworker: forge issues to reviewed, CI-verified pull requests written by coding agents."""

__version__ = "0.1.0"
