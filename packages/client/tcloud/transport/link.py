"""One Cluster's way to the login node: agent sessions and exec channels (`shell`,
`exec`, `logs`) through the connection master when one can be used
(tcloud.transport.mux), a direct verified SSH connection otherwise; and the direct
connection, opened on first use only, for what the master does not carry (SFTP,
`forward`'s channels)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tcloud import timing
from tcloud.config import Cluster
from tcloud.transport import agent, mux
from tcloud.transport.agent import AgentSession

if TYPE_CHECKING:
    import paramiko


@dataclass(frozen=True)
class Direct:
    """How to reach the login node directly: tcloud.transport.ssh's session and host_keys_known
    (or a test's stand-ins), handed in so that a command that goes through the master
    never loads paramiko."""

    open: Callable[[Cluster], AbstractContextManager]  # yields a paramiko.SSHClient
    keys_known: Callable[[Cluster], bool]  # may a master (which never asks) connect?


class Link:
    """What tcloud.transport.agent, tcloud.transfer.upload and tcloud.transfer.files are
    handed as `client`: it hands out agent sessions itself (agent.SessionSource) and
    passes every other use (open_sftp, get_transport, exec_command) to the direct
    connection."""

    def __init__(self, settings: Cluster, direct: Direct, multiplex: bool) -> None:
        self.settings = settings
        self.how = direct
        self.multiplex = multiplex and mux.enabled(settings)
        self.stack = ExitStack()
        self.lock = threading.Lock()
        self.opening = threading.Lock()  # one session opened at a time
        self._direct: paramiko.SSHClient | None = None
        self._session: AgentSession | None = None

    @property
    def direct(self) -> paramiko.SSHClient:
        """The verified SSH connection of this command alone, opened once."""
        with self.lock:
            if self._direct is None:
                self._direct = self.stack.enter_context(self.how.open(self.settings))
            return self._direct

    def agent_session(self) -> AgentSession:
        """The agent session: the master's when there is one (started now if the host's
        key is known), else one on the direct connection (which may ask at a terminal)."""
        with self.opening:
            known = self._session
            if known is not None and not known.dead:
                return known
            if self.multiplex and self._direct is None:
                with timing.step("mux"):
                    pipe = mux.open_session(
                        self.settings, lambda: self.how.keys_known(self.settings)
                    )
                if pipe is not None:
                    self._session = AgentSession(pipe)
                    return self._session
        return agent.session(self.direct)

    def shared_channel(self, command: str, terminal: tuple[str, int, int] | None):
        """An exec channel on the master's connection (agent.ChannelSource), when this
        command's agent session came from the master; None: use the direct connection."""
        if not self.multiplex or self._direct is not None:
            return None
        with timing.step("mux channel"):
            return mux.open_channel(self.settings, command, terminal)

    def may_start_master(self) -> bool:
        """A master never asks about a host key: only started once the keys are known."""
        return self.how.keys_known(self.settings)

    def open_sftp(self) -> paramiko.SFTPClient:
        return self.direct.open_sftp()

    def get_transport(self) -> paramiko.Transport | None:
        return self.direct.get_transport()

    def exec_command(self, command: str):
        return self.direct.exec_command(command)

    def close(self) -> None:
        with self.lock:
            session, self._session = self._session, None
            self._direct = None
        if session is not None:
            session.close()
        self.stack.close()
