"""QEMU guests from the controller's side: which backend a phase gets, provisioning the
image under the maintenance gate, and the operator's guest commands."""
