"""The connection master's failure handling (tcloud.mux_master), without an sshd: its
SSH side is stood in for; tests/integration/test_tcloud_mux.py runs it for real."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tcloud import mux_master
from tcloud.errors import TcloudError


def bare_master() -> mux_master.Master:
    """A Master with its bookkeeping but no SSH connection and no socket."""
    master = object.__new__(mux_master.Master)
    master.lock = threading.Lock()
    master.attached = 1
    master.last_seen = time.monotonic()
    master.spares = []
    master.starting = 0
    master.peak = 1
    master.closing = False
    return master


@pytest.mark.fault
def test_a_failure_to_give_a_session_is_said_to_the_client(monkeypatch):
    master = bare_master()

    def no_connection() -> None:
        raise TcloudError("cannot connect to login.example: timed out")

    monkeypatch.setattr(master, "take_session", no_connection)
    ours, theirs = socket.socketpair()
    ours.sendall(b'{"op": "session"}\n')
    master.client(theirs)  # returns: the master lives on
    answer = json.loads(ours.makefile("rb").readline())
    assert "timed out" in answer["mux_error"]
    assert master.attached == 0
