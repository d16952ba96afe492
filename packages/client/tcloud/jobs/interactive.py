"""Into a running job (docs/interactive.md): `tcloud shell` and `tcloud exec`. The job
is checked first (`job target`, a session verb: the agent refuses another user's job
or one that is not running, exit 4, before any channel opens); then each node's
command is one exec channel running the node's step from that answer (`srun --jobid
--overlap ... tacc-agent enter`, every word quoted by shlex.join), inside the job's
allocation: on the connection master's connection, or on the verified direct SSH
connection where there is no master. An agent whose answer has no step (older) gets
`tacc-agent job attach`, which checks again and runs the same step.

shell: a PTY (term from $TERM, size from the local terminal), the local terminal in raw
mode until it ends (restored on every exit path), SIGWINCH passed on as a PTY resize,
stdin and the channel relayed with select. With stdin not a terminal: no PTY, a plain
relay (like `ssh -T`). exec: one channel per node, at most 32 at once, each output line
prefixed `[host:rank] ` as `tcloud logs` does, whole lines only."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from tacc_contract import answers, verbs
from tcloud.errors import TcloudError, UsageError
from tcloud.transport import agent
from tcloud.transport.transport_errors import transport_errors

try:  # POSIX only: the shell's raw terminal (Windows has no termios: no PTY shell)
    import termios
    import tty
except ImportError:
    termios = tty = None

if TYPE_CHECKING:
    import paramiko

MAX_CHANNELS = 32  # exec: nodes run at once. sshd's MaxSessions (10 by default) may
# allow fewer session channels per connection: one it refuses waits for one of ours to
# close (ChannelGate), as nothing else tells how many the server allows.
# A node's step from `job target` is run for this long after the answer; a node whose
# turn comes later (more nodes than channels at once) gets `job attach`, which checks the
# job again (ended meanwhile: the agent's message, not srun's).
STEP_FRESH_SECONDS = 5.0
GATE_RETRIES = 3  # refused opens with none of ours open: then the refusal is the answer
CHUNK = 65536
DEFAULT_TERM = "xterm-256color"
NO_STATUS = 255
# srun's own report of a failed step ("srun: error: n3: task 0: Exited with exit code 3"),
# which --quiet keeps: exec reports each node's exit status itself, once.
SRUN_EXIT_LINE = re.compile(
    rb"srun: error: \S+: task \d+: (Exited with exit code|Killed by signal).*"
)


def target(client, userdir: str | None, job: str, rank: int | None = None) -> answers.JobTarget:
    """The job's nodes (JOB_TARGET), checked by the agent: the caller's, running."""
    return agent.call(client, verbs.JOB_TARGET, userdir, job=job, rank=rank)


def node_of(answer: dict, rank: int) -> dict:
    """The node of `rank` in a JOB_TARGET answer; UsageError naming the ranks there are."""
    for node in answer["nodes"]:
        if node["rank"] == rank:
            return node
    ranks = sorted(node["rank"] for node in answer["nodes"])
    there = f"ranks 0 to {ranks[-1]}" if ranks else "no running nodes"
    raise UsageError(f"--node {rank}: job {answer['job_id']} has {there}")


class ChannelGate:
    """Session channels opened on one connection: an open the server refuses (its
    MaxSessions reached) is tried again once one of ours has closed. (Channels the
    connection master carries are not its own: it opens more connections itself.)"""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.opened: set = set()  # ours, open

    def open(self, open_session: Callable[[], paramiko.Channel]) -> paramiko.Channel:
        refused_alone = 0
        while True:
            try:
                channel = open_session()
            except transport_errors():
                with self.changed:
                    refused_alone = 0 if self.opened else refused_alone + 1
                    if refused_alone > GATE_RETRIES:
                        raise
                    self.changed.wait(timeout=0.5)
                continue
            with self.changed:
                self.opened.add(channel)
            return channel

    def closed(self, channel) -> None:
        """`channel` closed: one fewer of ours open (nothing when it was not ours)."""
        with self.changed:
            if channel in self.opened:
                self.opened.discard(channel)
                self.changed.notify_all()


def step_command(step: Sequence[str], command: Sequence[str], pty: bool) -> str:
    """The command line of a node's step from `job target` (answers.TargetNode.step):
    srun's --pty for a terminal, the command's words after "--", every word quoted."""
    if not step or step[0] != "srun":  # its words are text: the answer's type is checked
        raise TcloudError(f"the cluster's agent answered a step that is not srun's: {step!r}")
    words = [step[0], "--pty", *step[1:]] if pty else list(step)
    return shlex.join([*words, "--", *command] if command else words)


def open_attach(
    client,
    userdir: str | None,
    node: answers.TargetNode,
    job: str,
    command: Sequence[str] = (),
    pty: tuple[str, int, int] | None = None,
    gate: ChannelGate | None = None,
) -> paramiko.Channel:
    """One exec channel running the node's step (pty: (term, columns, rows)); an agent
    that answered no step: `tacc-agent job attach`, which checks and runs it."""
    opened: list[paramiko.Channel] = []

    def open_session() -> paramiko.Channel:
        transport = client.get_transport()
        opened.append(gate.open(transport.open_session) if gate else transport.open_session())
        return opened[-1]

    try:
        if "step" in node:
            line = step_command(node["step"], command, pty is not None)
            return agent.open_command(client, line, open_session, pty)
        return agent.open_exec(
            client,
            verbs.JOB_ATTACH,
            userdir,
            open_session,
            pty,
            job=job,
            rank=node["rank"],
            command=list(command),
            pty=pty is not None,
        )
    except BaseException:
        if gate and opened:
            gate.closed(opened[-1])
        raise


# --- shell ---------------------------------------------------------------------------


def terminal_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        size = shutil.get_terminal_size()
    return size.columns, size.lines


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The local terminal in raw mode, restored on every way out (an error, Ctrl-C)."""
    if termios is None or tty is None:
        raise TcloudError("a raw terminal needs termios (POSIX); this system has none")
    saved = termios.tcgetattr(fd)
    try:
        # TCSADRAIN, as ssh(1) does: what was typed while the connection opened (a line
        # typed ahead of the prompt) stays to be sent; tty.setraw's default (TCSAFLUSH)
        # would throw it away.
        tty.setraw(fd, termios.TCSADRAIN)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def on_resize(channel, fd: int) -> Iterator[None]:
    """SIGWINCH passed on to the channel's PTY while the shell runs."""
    if not hasattr(signal, "SIGWINCH") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def resized(_signum, _frame) -> None:
        columns, rows = terminal_size(fd)
        with contextlib.suppress(Exception):
            channel.resize_pty(width=columns, height=rows)

    previous = signal.signal(signal.SIGWINCH, resized)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)


@contextlib.contextmanager
def terminated_exits() -> Iterator[None]:
    """SIGTERM (`kill`, a closing terminal emulator) raises SystemExit(143) while the
    shell runs, so every `finally` runs: the terminal leaves raw mode, the channel closes.
    Python's default for SIGTERM ends the process at once, skipping both."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, _frame) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def relay_pty(channel, stdin_fd: int, stdout_fd: int) -> int:
    """Keystrokes to the channel, its output (stdout and stderr are one on a PTY) to the
    terminal, until the channel closes: its exit status."""
    while True:
        readable, _, _ = select.select([channel, stdin_fd], [], [])
        if channel in readable:
            data = channel.recv(CHUNK)
            if not data:
                break
            write_all(stdout_fd, data)
        if stdin_fd in readable:
            data = os.read(stdin_fd, CHUNK)
            if not data:
                channel.shutdown_write()
                stdin_fd = -1  # read no more
                break
            channel.sendall(data)
    if stdin_fd < 0:  # local EOF: drain what the remote still says
        for data in iter(lambda: channel.recv(CHUNK), b""):
            write_all(stdout_fd, data)
    return status_of(channel)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def relay_plain(channel, stdin: BinaryIO, stdout: BinaryIO, stderr: BinaryIO) -> int:
    """No PTY: stdin copied to the channel (EOF passed on), its stdout and stderr to ours."""

    def feed() -> None:
        with contextlib.suppress(OSError, EOFError):
            for data in iter(lambda: read_some(stdin), b""):
                channel.sendall(data)
        with contextlib.suppress(Exception):
            channel.shutdown_write()

    def errors() -> None:
        for data in iter(lambda: channel.recv_stderr(CHUNK), b""):
            stderr.write(data)
            stderr.flush()

    threading.Thread(target=feed, daemon=True).start()
    err_thread = threading.Thread(target=errors, daemon=True)
    err_thread.start()
    for data in iter(lambda: channel.recv(CHUNK), b""):
        stdout.write(data)
        stdout.flush()
    err_thread.join()
    return status_of(channel)


def read_some(stream: BinaryIO) -> bytes:
    read1 = getattr(stream, "read1", None)
    return read1(CHUNK) if read1 is not None else stream.read(CHUNK)


def shell(client, userdir: str | None, job: str, rank: int = 0) -> int:
    """An interactive shell on rank's node of the job: its exit status."""
    node = node_of(target(client, userdir, job), rank)
    stdin = sys.stdin
    if not stdin.isatty():
        channel = open_attach(client, userdir, node, job)
        try:
            return relay_plain(channel, stdin.buffer, sys.stdout.buffer, sys.stderr.buffer)
        finally:
            channel.close()
    if os.name != "posix":
        raise TcloudError(
            "tcloud shell needs a POSIX terminal (termios) for a PTY; on Windows use "
            "`tcloud exec JOB -- CMD` or pipe stdin (no PTY)"
        )
    fd = stdin.fileno()
    columns, rows = terminal_size(fd)
    term = os.environ.get("TERM") or DEFAULT_TERM
    channel = open_attach(client, userdir, node, job, pty=(term, columns, rows))
    try:
        sys.stdout.flush()
        with terminated_exits(), raw_mode(fd), on_resize(channel, fd):
            return relay_pty(channel, fd, sys.stdout.fileno())
    finally:
        channel.close()


# --- exec ----------------------------------------------------------------------------


@dataclass
class NodeResult:
    """One node's command: where, its exit status, and (captured) its output."""

    host: str
    rank: int
    exit_code: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)

    def as_dict(self) -> dict:
        return {
            "host": self.host,
            "rank": self.rank,
            "exit_code": self.exit_code,
            "stdout": self.stdout.decode(errors="replace"),
            "stderr": self.stderr.decode(errors="replace"),
        }


class LineWriter:
    """Whole lines, each prefixed, written under one lock (never interleaved mid-line)."""

    def __init__(self, out: BinaryIO, err: BinaryIO) -> None:
        self.streams = {"stdout": out, "stderr": err}
        self.lock = threading.Lock()

    def write(self, prefix: bytes, name: str, lines: list[bytes]) -> None:
        stream = self.streams[name]
        with self.lock:
            stream.write(b"".join(prefix + line + b"\n" for line in lines))
            stream.flush()


Sink = Callable[[NodeResult, str, list[bytes]], None]


def split_lines(pending: bytearray, data: bytes) -> list[bytes]:
    """The lines that `data` completes; what is left unfinished stays in `pending`. Only
    the new chunk is searched for a newline and an unfinished line grows in place, so a
    long line costs its length, not its length times its chunks."""
    end = data.rfind(b"\n")
    if end < 0:
        pending += data
        return []
    pending += data[:end]
    complete = bytes(pending).split(b"\n")
    pending[:] = data[end + 1 :]
    return complete


def pump(receive: Callable[[int], bytes], emit: Callable[[list[bytes]], None]) -> None:
    pending = bytearray()
    for data in iter(lambda: receive(CHUNK), b""):
        if complete := split_lines(pending, data):
            emit(complete)
    if pending:
        emit([bytes(pending)])


def without_srun_report(lines: list[bytes]) -> list[bytes]:
    return [line for line in lines if not SRUN_EXIT_LINE.fullmatch(line.rstrip(b"\r"))]


def run_node(channel, result: NodeResult, sink: Sink) -> NodeResult:
    """One node's channel read to its end (stderr on a thread of its own)."""
    channel.shutdown_write()  # exec takes no stdin

    def errors_out(lines: list[bytes]) -> None:
        if kept := without_srun_report(lines):
            sink(result, "stderr", kept)

    errors = threading.Thread(target=pump, args=(channel.recv_stderr, errors_out))
    errors.start()
    try:
        pump(channel.recv, lambda lines: sink(result, "stdout", lines))
    finally:
        errors.join()
    result.exit_code = status_of(channel)
    return result


def status_of(channel) -> int:
    """The remote exit status; 255 when the channel closed without one (as ssh says)."""
    status = channel.recv_exit_status()
    return NO_STATUS if status < 0 else status


def ranks_of(answer: dict, ranks: Sequence[int] | None) -> list[dict]:
    """The nodes asked for: all of them (None) or these ranks (each checked)."""
    if ranks is None:
        return sorted(answer["nodes"], key=lambda node: node["rank"])
    return [node_of(answer, rank) for rank in ranks]


def execute(
    client,
    userdir: str | None,
    job: str,
    command: Sequence[str],
    ranks: Sequence[int] | None,
    sink: Sink,
) -> list[NodeResult]:
    """The command on each node asked for (None: every node), concurrently."""
    if not command:
        raise UsageError("exec: expected a command after `--` (tcloud exec JOB -- CMD ...)")
    nodes = ranks_of(target(client, userdir, job), ranks)
    answered = time.monotonic()

    gate = ChannelGate()
    running = OpenChannels()

    def one(node: dict) -> NodeResult:
        result = NodeResult(node["host"], node["rank"], -1)
        if time.monotonic() - answered > STEP_FRESH_SECONDS:
            node = {key: value for key, value in node.items() if key != "step"}
        channel = open_attach(client, userdir, node, job, command, gate=gate)
        try:
            running.add(channel)  # closed at once when Ctrl-C came while it opened
            return run_node(channel, result, sink)
        finally:
            running.discard(channel)
            channel.close()
            gate.closed(channel)

    pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_CHANNELS, len(nodes))))
    try:
        futures = [pool.submit(one, node) for node in nodes]
        results = results_of(futures)
    except KeyboardInterrupt:
        # Ctrl-C: no waiting for the remote commands. Closing each channel ends its
        # command on the node (its srun step loses its connection) and wakes the
        # threads reading it; nodes not started yet never start.
        running.close_all()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    except BaseException:
        pool.shutdown(wait=True)  # one node failed: the others run to their end
        raise
    pool.shutdown(wait=True)
    return results


# How often the main thread wakes while it waits for the nodes: a Ctrl-C that the kernel
# delivered to one of the reading threads is only taken when the main thread runs.
SIGNAL_POLL_SECONDS = 0.2


def results_of(futures: list[Future]) -> list:
    """Each future's result in order, the first failure raised at once; the wait wakes
    every SIGNAL_POLL_SECONDS (a lock wait with no timeout is interrupted only by a
    signal delivered to the main thread itself: about 2 in 100 Ctrl-Cs were not)."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=SIGNAL_POLL_SECONDS, return_when=FIRST_EXCEPTION)
        for future in done:
            if (error := future.exception()) is not None:
                raise error
    return [future.result() for future in futures]


class OpenChannels:
    """exec's channels still open; close_all() closes them and every one added later."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.channels: set = set()
        self.stopped = False

    def add(self, channel) -> None:
        with self.lock:
            if not self.stopped:
                self.channels.add(channel)
                return
        channel.close()
        raise KeyboardInterrupt

    def discard(self, channel) -> None:
        with self.lock:
            self.channels.discard(channel)

    def close_all(self) -> None:
        with self.lock:
            self.stopped = True
            channels, self.channels = list(self.channels), set()
        for channel in channels:
            with contextlib.suppress(Exception):
                channel.close()


def capture(result: NodeResult, name: str, lines: list[bytes]) -> None:
    """The SDK's sink: each node's output kept as it came."""
    getattr(result, name).extend(b"".join(line + b"\n" for line in lines))


def prefixed(writer: LineWriter) -> Sink:
    """The CLI's sink: `[host:rank] ` before each line, stdout to stdout, stderr to stderr."""

    def sink(result: NodeResult, name: str, lines: list[bytes]) -> None:
        writer.write(f"[{result.host}:{result.rank}] ".encode(), name, lines)

    return sink


def exit_code(results: list[NodeResult], every: bool) -> tuple[int, list[str]]:
    """One node: its status. --all: 0 when every node's is 0, else the largest, with a
    line per failing node."""
    if not every:
        return results[0].exit_code, []
    failing = [r for r in results if r.exit_code != 0]
    lines = [f"[{r.host}:{r.rank}] exited {r.exit_code}" for r in failing]
    return max((r.exit_code for r in failing), default=0), lines
