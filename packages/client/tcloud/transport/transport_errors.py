"""What a broken SSH connection raises, without loading paramiko to say so.

paramiko's SSHException is among them only once paramiko is loaded: before that nothing
can raise it. So the modules on the path of a command that goes through the connection
master (tcloud.transport.mux), which never loads paramiko, catch the same errors as one that
connects directly."""

from __future__ import annotations

import sys


def transport_errors() -> tuple[type[BaseException], ...]:
    """OSError and EOFError, and paramiko.SSHException when paramiko is loaded."""
    paramiko = sys.modules.get("paramiko")
    ssh_error = getattr(paramiko, "SSHException", None)
    return (OSError, EOFError) if ssh_error is None else (OSError, EOFError, ssh_error)
