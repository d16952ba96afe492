"""FAKE (lab only): stand-ins for GPU and Mellanox NIC tools on nodes without that hardware.

The lab's systemd-nspawn nodes have no GPUs and no ConnectX NICs, so roles are tested against
fake ``lspci``, ``nvidia-smi``, ``mstflint``, ``mlxconfig`` and ``mlxfwmanager`` executables that
print the real tools' documented output formats for a small subset of commands. They read one
JSON state file (see ``hwstate``) and append firmware burns and config changes to a log.
Every module uses only the standard library and runs both as ``python3 -m tacc_lab.fakes.X``
and as a standalone file.
"""
