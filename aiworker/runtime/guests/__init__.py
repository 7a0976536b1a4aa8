"""QEMU guests: the image store, QEMU itself (argv, QMP), SSH with a pinned host key, the
egress proxy, and the execution backend that runs phases and checks inside a guest."""
