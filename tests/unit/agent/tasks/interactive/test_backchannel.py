"""The forward's connection back (tasks/interactive/backchannel.py) and `job connect`'s
side of it (tasks/interactive/connect.py: carry), against a real `tacc-agent relay
--back` process with pipes for its stdio, as srun gives it: the offer, both keys, the
bytes and each end, the fallback to stdio, and strangers on the port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tacc_agent.errors import AGENT_CLUSTER, AGENT_REJECTED
from tacc_agent.tasks.interactive import backchannel, connect, relay
from tacc_agent.tasks.interactive.backchannel import KEY_BYTES, Gate, Offer, OfferError
from tacc_agent.tasks.interactive.pumps import End

RELAY = [sys.executable, "-m", "tacc_agent", "relay"]


# ---------------------------------------------------------------- the offer
def test_an_offer_goes_as_one_line_and_comes_back_the_same():
    offer = Offer.fresh(40123)
    line = offer.line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert Offer.parse(line) == offer
    assert offer.relay_key != offer.connect_key and len(offer.relay_key) == KEY_BYTES


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"40123\n",
        b"40123 zz " + b"00" * KEY_BYTES + b"\n",
        b"40123 " + b"00" * 8 + b" " + b"00" * KEY_BYTES + b"\n",
        b"0 " + b"00" * KEY_BYTES + b" " + b"00" * KEY_BYTES + b"\n",
        b"70000 " + b"00" * KEY_BYTES + b" " + b"00" * KEY_BYTES + b"\n",
        b"\xff\xfe " + b"00" * KEY_BYTES + b"\n",
    ],
)
def test_a_bad_offer_is_an_offer_error_naming_what_is_expected(line):
    with pytest.raises(OfferError, match="expected"):
        Offer.parse(line)


def test_the_offer_is_read_to_its_newline_and_no_further():
    read, write = os.pipe()
    offer = Offer.fresh(1234)
    os.write(write, offer.line() + b"the caller's bytes")
    os.close(write)
    assert backchannel.read_offer(read) == offer
    assert os.read(read, 100) == b"the caller's bytes"
    os.close(read)


@pytest.mark.bad_input
def test_an_offer_without_its_newline_or_too_long_is_refused():
    for data in (b"1234 ab", b"9" * 1000):
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        with pytest.raises(OfferError, match="newline"):
            backchannel.read_offer(read)
        os.close(read)


# ---------------------------------------------------------------- the gate, both keys
def gate_on(offer_port: int | None = None) -> tuple[socket.socket, Offer, int, int]:
    listener = backchannel.listen()
    offer = Offer.fresh(offer_port or listener.getsockname()[1])
    stop_read, stop_write = os.pipe()
    return listener, offer, stop_read, stop_write


def waited(gate: Gate) -> tuple[threading.Thread, list]:
    found: list = []
    thread = threading.Thread(target=lambda: found.append(gate.wait()), daemon=True)
    thread.start()
    return thread, found


def relay_side(offer: Offer) -> socket.socket:
    """What the relay does (relay.relay_back): connect to 127.0.0.1:PORT, prove."""
    sock = backchannel.connection_to("127.0.0.1", offer.port)
    try:
        backchannel.prove(sock, offer)
    except BaseException:
        sock.close()
        raise
    return sock


def test_the_relay_and_job_connect_each_prove_their_key():
    listener, offer, stop_read, stop_write = gate_on()
    thread, found = waited(Gate(listener, offer, stop_read))
    back = relay_side(offer)
    thread.join(timeout=5)
    assert found and found[0] is not None
    found[0].sendall(b"ping")
    assert back.recv(4) == b"ping"
    assert listener.fileno() == -1  # no other connection is taken after the first
    for sock in (back, found[0]):
        sock.close()
    os.close(stop_read)
    os.close(stop_write)


@pytest.mark.security
def test_strangers_on_the_port_get_no_byte_and_do_not_keep_the_relay_out():
    """Any user on the cluster can connect to job connect's port: one that sends a wrong
    key, one that says nothing and stays, one that sends a key a byte short; none gets
    a byte, and the relay's own connection still gets through."""
    listener, offer, stop_read, stop_write = gate_on()
    thread, found = waited(Gate(listener, offer, stop_read))
    port = listener.getsockname()[1]
    wrong = socket.create_connection(("127.0.0.1", port))
    wrong.sendall(bytes(KEY_BYTES))
    silent = socket.create_connection(("127.0.0.1", port))
    short = socket.create_connection(("127.0.0.1", port))
    short.sendall(offer.relay_key[:-1])
    back = relay_side(offer)
    thread.join(timeout=5)
    assert found and found[0] is not None
    wrong.settimeout(5)
    assert wrong.recv(100) == b""  # dropped, nothing said
    for stranger in (silent, short):
        stranger.settimeout(5)
        assert stranger.recv(100) == b""  # the gate closed them when it let the relay in
    for sock in (wrong, silent, short, back, found[0]):
        sock.close()
    os.close(stop_read)
    os.close(stop_write)


@pytest.mark.security
def test_the_relay_sends_nothing_to_an_end_that_does_not_answer_the_connect_key():
    """Someone else listening where the relay connects back (the port taken over after
    job connect died) gets the relay's key, a one-time key, and nothing of the program."""
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        offer = Offer.fresh(squatter.getsockname()[1])

        def answer_wrong() -> None:
            conn, _ = squatter.accept()
            conn.recv(KEY_BYTES)
            conn.sendall(bytes(KEY_BYTES))
            time.sleep(1)
            conn.close()

        threading.Thread(target=answer_wrong, daemon=True).start()
        with pytest.raises(OSError, match="did not answer with the connect key"):
            relay_side(offer)


def test_the_step_ending_before_any_connection_ends_the_wait():
    listener, offer, stop_read, stop_write = gate_on()
    thread, found = waited(Gate(listener, offer, stop_read))
    os.close(stop_write)
    thread.join(timeout=5)
    assert found == [None]
    os.close(stop_read)


# ---------------------------------------------------------------- job connect and the relay
@contextmanager
def program(handler) -> Iterator[int]:
    """A program of the caller's on a loopback port; handler(conn) serves one connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                handler(conn)

        threading.Thread(target=serve, daemon=True).start()
        yield server.getsockname()[1]


class Forwarded:
    """`carry` on a thread with a real `tacc-agent relay --back` as its step (what srun
    runs on the node), the caller's stdin and stdout as pipes (the SSH channel's)."""

    def __init__(self, port: int, env: dict[str, str]) -> None:
        self.caller_in, self.to_caller_in = os.pipe()
        self.from_caller_out, self.caller_out = os.pipe()
        listener = backchannel.listen()
        step_in_read, step_in = os.pipe()
        step_out, step_out_write = os.pipe()
        self.step = subprocess.Popen(
            [*RELAY, "--port", str(port), "--back"],
            stdin=step_in_read,
            stdout=step_out_write,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
        )
        os.close(step_in_read)
        os.close(step_out_write)
        caller = End.of_pipes(self.caller_in, self.caller_out)
        self.status: list[int] = []
        args = (self.step, listener, step_in, step_out, caller)
        self.thread = threading.Thread(
            target=lambda: self.status.append(connect.carry(*args)), daemon=True
        )
        self.thread.start()

    def send(self, data: bytes, end: bool = True) -> None:
        os.write(self.to_caller_in, data)
        if end:
            os.close(self.to_caller_in)

    def received(self) -> bytes:
        got = b""
        while chunk := os.read(self.from_caller_out, 1 << 16):
            got += chunk
        return got

    def finished(self, timeout: float = 10) -> tuple[int | None, str]:
        self.thread.join(timeout=timeout)
        self.step.wait(timeout=timeout)
        return (self.status[0] if self.status else None), self.step.stderr.read().decode()


def upper(conn: socket.socket) -> None:
    data = b""
    while chunk := conn.recv(1 << 16):
        data += chunk
    conn.sendall(data.upper())


HERE = {backchannel.SRUN_HOST: "127.0.0.1"}


def test_bytes_go_both_ways_over_the_connection_back_with_each_end():
    payload = b"notebook" * 200_000  # 1.6 MB: more than srun's stdio would carry quickly
    with program(upper) as port:
        forwarded = Forwarded(port, HERE)
        threading.Thread(target=forwarded.send, args=(payload,), daemon=True).start()
        assert forwarded.received() == payload.upper()
        status, err = forwarded.finished()
    assert status == 0 and err == ""


@pytest.mark.fault
def test_the_programs_end_ends_the_forwarded_connection_while_the_caller_still_sends():
    """An HTTP/1.0 server, a stream that ends: the caller sees the end and the step
    ends (sshd ends the channel's stdout only when the step's stderr closes too), though
    the caller has not ended its side."""

    def say_and_close(conn: socket.socket) -> None:
        conn.sendall(b"whole answer")

    with program(say_and_close) as port:
        forwarded = Forwarded(port, HERE)
        forwarded.send(b"GET / HTTP/1.0\r\n\r\n", end=False)
        assert forwarded.received() == b"whole answer"
        status, err = forwarded.finished()
    assert status == 0 and err == ""


@pytest.mark.fault
def test_without_a_way_back_the_bytes_go_through_srun_and_one_line_says_so():
    with program(upper) as port:
        forwarded = Forwarded(port, {backchannel.SRUN_HOST: ""})
        forwarded.send(b"slow but there")
        assert forwarded.received() == b"SLOW BUT THERE"
        status, err = forwarded.finished()
    assert status == 0
    assert err.count("\n") == 1 and "relaying through srun's stdio" in err


@pytest.mark.fault
def test_the_ssh_channel_going_away_ends_the_relay_while_the_program_still_talks():
    def endless(conn: socket.socket) -> None:
        chunk = b"x" * 65536
        while True:
            try:
                conn.sendall(chunk)
            except OSError:
                return

    with program(endless) as port:
        forwarded = Forwarded(port, HERE)
        assert os.read(forwarded.from_caller_out, 10)
        os.close(forwarded.from_caller_out)  # sshd's end of the channel: gone
        os.close(forwarded.to_caller_in)
        status, _ = forwarded.finished(timeout=10)
    assert status is not None and forwarded.step.returncode is not None


@pytest.mark.bad_input
def test_a_refusal_on_the_node_is_its_line_and_status_with_no_connection_back(capfd):
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        forwarded = Forwarded(bound.getsockname()[1], HERE)  # bound, nothing listens
        os.close(forwarded.to_caller_in)
        assert forwarded.received() == b""
        status, err = forwarded.finished()
    assert status == AGENT_REJECTED and err.count("\n") == 1 and "nothing listens" in err


def io_counts() -> tuple[int, int]:
    text = Path("/proc/self/io").read_text()
    counts = dict(line.split(": ") for line in text.splitlines())
    return int(counts["rchar"]), int(counts["wchar"])


@pytest.mark.fault
def test_the_relays_bytes_show_in_its_read_and_write_counts_for_the_idle_watchdog():
    """A session's watchdog counts forwarded traffic by what the relay reads and writes
    (/proc/PID/io); splice(2) would move the bytes without a count, and a session in
    use through its forward would be stopped as idle."""
    size = 4 << 20
    program, program_end = socket.socketpair()
    back, back_end = socket.socketpair()

    def talk() -> None:
        program_end.sendall(b"p" * size)  # socket sends count nowhere: only the relay's do
        program_end.shutdown(socket.SHUT_WR)
        while program_end.recv(1 << 20):
            pass

    def listen_back() -> None:
        while back_end.recv(1 << 20):
            pass
        back_end.close()

    threads = [threading.Thread(target=f, daemon=True) for f in (talk, listen_back)]
    for thread in threads:
        thread.start()
    before = io_counts()
    relay.across(program, back)
    read, written = (after - first for after, first in zip(io_counts(), before, strict=True))
    assert read >= size and written >= size, (read, written)


@pytest.mark.fault
def test_the_ssh_channel_going_away_ends_the_relay_while_the_program_is_silent():
    """A dropped channel is not a half-close: job connect resets the connection back,
    and the relay shuts the program's side too, though the program never says a word."""
    heard: list[bytes] = []

    def silent(conn: socket.socket) -> None:
        heard.append(conn.recv(100))  # the caller's end (b"") when the relay lets go

    with program(silent) as port:
        forwarded = Forwarded(port, HERE)
        time.sleep(0.5)  # connected back, both sides waiting
        os.close(forwarded.from_caller_out)  # sshd's end of the channel: gone
        os.close(forwarded.to_caller_in)
        status, _ = forwarded.finished(timeout=10)
    assert status is not None and forwarded.step.returncode is not None and heard == [b""]


def relay_alone(port: int, env: dict[str, str], offer: Offer) -> subprocess.CompletedProcess:
    """`relay --port PORT --back` given this offer, its stdio captured."""
    return subprocess.run(
        [*RELAY, "--port", str(port), "--back"],
        input=offer.line(),
        capture_output=True,
        timeout=30,
        env={**os.environ, **env},
        check=False,
    )


@pytest.mark.fault
def test_a_connection_back_whose_proof_fails_is_an_error_never_a_fallback():
    """job connect may already have taken the connection (a stalled login node): a
    relay that then fell back to srun's stdio would leave job connect reading the other
    way, for ever. So once connected, no answer is the relay's error and exit."""
    with (
        program(upper) as port,
        socket.create_server(("127.0.0.1", 0)) as mute,
    ):
        offer = Offer.fresh(mute.getsockname()[1])

        def take_key_and_hang_up() -> None:
            conn, _ = mute.accept()
            conn.recv(KEY_BYTES)
            conn.close()

        threading.Thread(target=take_key_and_hang_up, daemon=True).start()
        done = relay_alone(port, HERE, offer)
    assert done.returncode == AGENT_CLUSTER and done.stdout == b""
    assert b"did not answer with the connect key" in done.stderr


@pytest.mark.security
def test_srun_s_host_must_be_an_ip_address_or_the_relay_does_not_connect_back():
    """A name could resolve to another login node where someone listens on the same
    port and passes the keys on: the relay falls back to srun's stdio instead."""
    with program(upper) as port:
        offer = Offer.fresh(9)
        done = relay_alone(port, {backchannel.SRUN_HOST: "localhost"}, offer)
    assert done.returncode == 0 and done.stdout.startswith(backchannel.FALLBACK)
    assert b"'localhost' is not an IP address" in done.stderr
