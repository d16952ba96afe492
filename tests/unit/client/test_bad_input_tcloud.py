"""Bad input to `tcloud` (issue [7]): every case runs the real console script, must exit
non-zero with a message that names the file, line and field (or the path and setting)
and what is expected, print no traceback, and reach nothing: the configured cluster is a
local port that counts connection attempts, and a refused case makes none.

Task-file cases run `tcloud submit` for real (not --dry-run), so a case that validation
let through would go on to connect.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli

pytestmark = pytest.mark.bad_input


class Sentinel:
    """Where the test cluster is configured: a port that counts connection attempts and
    closes each at once, so a client that does connect fails fast."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.attempts = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.attempts += 1
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Tcloud:
    """The console script with a private config (cluster = the sentinel), home and cache."""

    def __init__(self, tmp: Path, sentinel: Sentinel) -> None:
        self.sentinel = sentinel
        self.config = tmp / "config.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "current": "lab",
                    "clusters": {
                        "lab": {
                            "host": "127.0.0.1",
                            "port": sentinel.port,
                            "user": "nobody",
                            "known_hosts": str(tmp / "known_hosts"),
                        }
                    },
                }
            )
        )
        (tmp / "home").mkdir()
        self.env = {
            "TCLOUD_CONFIG": str(self.config),
            "TCLOUD_CACHE_DIR": str(tmp / "cache"),
            "TCLOUD_CLUSTER": "lab",
            "HOME": str(tmp / "home"),
        }

    def __call__(self, *argv: str, env: dict | None = None, cwd: Path | None = None):
        kwargs = {"cwd": cwd} if cwd else {}
        return run_cli("tcloud", *argv, env={**self.env, **(env or {})}, timeout=120, **kwargs)

    def refused(self, proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
        """Assert the refusal; return stderr."""
        output = proc.stdout + proc.stderr
        assert proc.returncode == code, output
        assert "Traceback" not in output and "internal error" not in output, output
        for fragment in fragments:
            assert fragment in proc.stderr, (fragment, proc.stderr)
        assert self.sentinel.attempts == 0, "the cluster was contacted"
        return proc.stderr


@pytest.fixture
def tcloud(tmp_path):
    sentinel = Sentinel()
    yield Tcloud(tmp_path, sentinel)
    sentinel.close()


def task_dir(root: Path, text: str | bytes, name: str = "tcloud.yaml") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


OK = "name: t\nrun: [echo hi]\n"
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)

# (id, task file, fragments stderr must hold). Each fragment names the line:column and
# field, or what is expected.
TASK_FILE_CASES = [
    # --- malformed YAML
    ("tab-indentation", "name: t\nrun:\n\t- echo\n", ["tcloud.yaml:3:1: not valid YAML", "'\\t'"]),
    ("unclosed-bracket", "name: t\nrun: [echo\n", ["tcloud.yaml:3:1: not valid YAML"]),
    ("unclosed-quote", 'name: "t\nrun: [echo]\n', ["tcloud.yaml:3:1: not valid YAML"]),
    ("duplicate-top-key", "name: t\nname: u\nrun: [x]\n", ["tcloud.yaml:2:1: name: appears twice"]),
    (
        "duplicate-env-name",
        "name: t\nrun: [x]\nenvironment:\n  env: {A: '1', A: '2'}\n",
        ["tcloud.yaml:4:17: environment.env.A: appears twice"],
    ),
    (
        "duplicate-sbatch-option",
        "name: t\nrun: [x]\nresources:\n  sbatch:\n    exclusive: ''\n    exclusive: x\n",
        ["tcloud.yaml:6:5: resources.sbatch.exclusive: appears twice"],
    ),
    (
        "two-documents",
        "name: t\nrun: [x]\n---\nname: u\n",
        ["tcloud.yaml:3:1: not valid YAML: but found another document"],
    ),
    (
        "top-level-list",
        "- name: t\n- run: [x]\n",
        ["tcloud.yaml:1:1: (top): expected a mapping of keys to values, got a list"],
    ),
    (
        "top-level-text",
        "just some text\n",
        ["tcloud.yaml:1:1: (top): expected a mapping of keys to values, got 'just some text'"],
    ),
    ("empty-file", "", ["tcloud.yaml:1:1: empty file"]),
    ("only-comments", "# name: t\n# run: [x]\n", ["tcloud.yaml:1:1: empty file"]),
    (
        "not-utf8",
        b"name: caf\xe9\nrun: [x]\n",
        ["tcloud.yaml:1:10: not UTF-8 text: byte 0xe9", "save the file as UTF-8"],
    ),
    (
        "control-character",
        "name: t\x01\nrun: [x]\n",
        ["tcloud.yaml:1:8: not valid YAML: control character '\\x01'"],
    ),
    (
        "list-as-key",
        "name: t\nrun: [x]\n? [a, b]\n: c\n",
        ["tcloud.yaml:3:3: (top): expected a key name, got a list as a key"],
    ),
    ("nested-too-deeply", "name: t\nrun: " + "[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
    ("alias-bomb", ALIAS_BOMB + "name: t\nrun: *i\n", ["run[0]: expected a string, got a list"]),
    # --- wrong types, one per field kind
    (
        "name-list",
        "name: [a]\nrun: [x]\n",
        ["tcloud.yaml:1:7: name: expected a string, got a list"],
    ),
    (
        "name-null",
        "name:\nrun: [x]\n",
        ["tcloud.yaml:1:6: name: expected a string, got nothing (null)"],
    ),
    (
        "nodes-word",
        "name: t\nrun: [x]\nresources: {nodes: two}\n",
        ["tcloud.yaml:3:20: resources.nodes: expected a node count >= 1", "got 'two'"],
    ),
    (
        "nodes-bool",
        "name: t\nrun: [x]\nresources: {nodes: true}\n",
        ["resources.nodes: expected a node count >= 1, or a range like 2-4, got True"],
    ),
    (
        "nodes-float",
        "name: t\nrun: [x]\nresources: {nodes: 1.5}\n",
        ["resources.nodes: expected a node count >= 1, or a range like 2-4, got 1.5"],
    ),
    (
        "cpus-mapping",
        "name: t\nrun: [x]\nresources: {cpus: {n: 1}}\n",
        ["resources.cpus: expected CPUs per task (>= 1), got a mapping"],
    ),
    (
        "gpus-list",
        "name: t\nrun: [x]\nresources: {gpus_per_node: [1]}\n",
        ["resources.gpus_per_node: expected whole GPUs (0, 1, 2, ...) or a", "got a list"],
    ),
    (
        "mem-list",
        "name: t\nrun: [x]\nresources: {mem: [4G]}\n",
        ["resources.mem: expected a size like 4G or 512M, got a list"],
    ),
    (
        "priority-word",
        "name: t\nrun: [x]\nresources: {priority: high}\n",
        ["resources.priority: expected a nice value >= 0, got 'high'"],
    ),
    (
        "run-text",
        "name: t\nrun: echo hi\n",
        ["tcloud.yaml:2:6: run: expected a list of shell lines, got 'echo hi'"],
    ),
    (
        "run-nested-list",
        "name: t\nrun: [[echo, hi]]\n",
        ["tcloud.yaml:2:7: run[0]: expected a string, got a list"],
    ),
    (
        "setup-mapping",
        "name: t\nrun: [x]\nsetup: {a: b}\n",
        ["setup: expected a list of shell lines, got a mapping"],
    ),
    (
        "env-list",
        "name: t\nrun: [x]\nenvironment: {env: [A=1]}\n",
        ["environment.env: expected a mapping of names to strings, got a list"],
    ),
    (
        "env-value-list",
        "name: t\nrun: [x]\nenvironment: {env: {A: [1, 2]}}\n",
        ["environment.env.A: expected a string, got a list"],
    ),
    (
        "environment-text",
        "name: t\nrun: [x]\nenvironment: conda\n",
        ["environment: expected a mapping of keys to values, got 'conda'"],
    ),
    (
        "requirements-text",
        "name: t\nrun: [x]\nenvironment: {requirements: numpy}\n",
        ["environment.requirements: expected pip requirement lines, got 'numpy'"],
    ),
    (
        "datasets-mapping",
        "name: t\nrun: [x]\ndatasets: {name: d, cluster: /d}\n",
        ["datasets: expected a list of mappings, got a mapping"],
    ),
    (
        "dataset-text",
        "name: t\nrun: [x]\ndatasets: [imagenet]\n",
        ["datasets[0]: expected a mapping of keys to values, got 'imagenet'"],
    ),
    (
        "include-text",
        "name: t\nrun: [x]\ncode: {include: '**'}\n",
        ["code.include: expected a list of strings, got '**'"],
    ),
    (
        "launcher-number",
        "name: t\nrun: [x]\nruntime: {launcher: 5}\n",
        ["runtime.launcher: expected one of srun, torchrun, mpirun, none, got '5'"],
    ),
    # --- unknown keys
    (
        "unknown-top-key",
        "nmae: t\nrun: [x]\n",
        ["tcloud.yaml:1:1: nmae: unknown key (did you mean 'name'?)", "name: missing"],
    ),
    (
        "unknown-section",
        "name: t\nrun: [x]\nresource: {nodes: 2}\n",
        ["resource: unknown key (did you mean 'resources'?)"],
    ),
    (
        "unknown-resource",
        "name: t\nrun: [x]\nresources: {memory: 4G}\n",
        ["resources.memory: unknown key (did you mean 'mem'?)"],
    ),
    (
        "unknown-dataset-key",
        "name: t\nrun: [x]\ndatasets: [{name: d, locl: ./d}]\n",
        ["datasets[0].locl: unknown key (did you mean 'local'?)"],
    ),
    (
        "unknown-runtime-key",
        "name: t\nrun: [x]\nruntime: {launchr: srun}\n",
        ["runtime.launchr: unknown key (did you mean 'launcher'?)"],
    ),
    (
        "unknown-no-hint",
        "name: t\nrun: [x]\nfoo: 1\n",
        ["tcloud.yaml:3:1: foo: unknown key; known keys: name, code, resources"],
    ),
    # --- negative, zero, impossible resources
    (
        "nodes-zero",
        "name: t\nrun: [x]\nresources: {nodes: 0}\n",
        ["resources.nodes: expected a node count >= 1, or a range like 2-4, got 0"],
    ),
    (
        "nodes-negative",
        "name: t\nrun: [x]\nresources: {nodes: -2}\n",
        ["resources.nodes: expected a node count >= 1, or a range like 2-4, got -2"],
    ),
    (
        "cpus-zero",
        "name: t\nrun: [x]\nresources: {cpus: 0}\n",
        ["resources.cpus: expected an integer >= 1, got 0"],
    ),
    (
        "cpus-and-cpus-per-gpu",
        "name: t\nrun: [x]\nresources:\n  gpus_per_node: 8\n  cpus: 4\n  cpus_per_gpu: 8\n",
        ["tcloud.yaml:6:17: resources.cpus_per_gpu: set either cpus or cpus_per_gpu, not both"],
    ),
    (
        "mem-per-gpu-without-gpus",
        "name: t\nrun: [x]\nresources: {mem_per_gpu: 64G}\n",
        [
            "tcloud.yaml:3:26: resources.mem_per_gpu: needs whole GPUs: set "
            "resources.gpus_per_node (1 or more)"
        ],
    ),
    (
        "cpus-per-gpu-zero",
        "name: t\nrun: [x]\nresources: {gpus_per_node: 2, cpus_per_gpu: 0}\n",
        ["resources.cpus_per_gpu: expected an integer >= 1, got 0"],
    ),
    (
        "gpus-not-a-number",
        "name: t\nrun: [x]\nresources: {gpus_per_node: .nan}\n",
        ["tcloud.yaml:3:28: resources.gpus_per_node: expected whole GPUs", "got nan"],
    ),
    (
        "gpus-infinite",
        "name: t\nrun: [x]\nresources: {gpus_per_node: .inf}\n",
        ["tcloud.yaml:3:28: resources.gpus_per_node: expected whole GPUs", "got inf"],
    ),
    (
        "gpus-negative",
        "name: t\nrun: [x]\nresources: {gpus_per_node: -1}\n",
        ["resources.gpus_per_node: expected whole GPUs (0, 1, 2, ...) or a", "got -1"],
    ),
    (
        "priority-negative",
        "name: t\nrun: [x]\nresources: {priority: -5}\n",
        ["resources.priority: expected an integer from 0 to 2147483645, got -5"],
    ),
    (
        "priority-too-big",
        "name: t\nrun: [x]\nresources: {priority: 2147483646}\n",
        ["resources.priority: expected an integer from 0 to 2147483645, got 2147483646"],
    ),
    (
        "mem-zero",
        "name: t\nrun: [x]\nresources: {mem: '0'}\n",
        ["resources.mem: expected a size > 0 like 4G or 512M, got '0'"],
    ),
    (
        "mem-negative",
        "name: t\nrun: [x]\nresources: {mem: -4G}\n",
        ["resources.mem: expected a size > 0 like 4G or 512M, got '-4G'"],
    ),
    (
        "mem-with-space",
        "name: t\nrun: [x]\nresources: {mem: 4 GB}\n",
        ["resources.mem: expected a size > 0 like 4G or 512M, got '4 GB'"],
    ),
    (
        "time-zero",
        "name: t\nrun: [x]\nresources: {time: '00:00:00'}\n",
        ["resources.time: expected a Slurm time > 0 (or UNLIMITED), got '00:00:00'"],
    ),
    (
        "time-minutes-75",
        "name: t\nrun: [x]\nresources: {time: '1:75:00'}\n",
        [
            "resources.time: expected a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS) with "
            "fields in range, got '1:75:00'"
        ],
    ),
    (
        "time-hours-25-after-day",
        "name: t\nrun: [x]\nresources: {time: 2-25:00:00}\n",
        ["with fields in range, got '2-25:00:00'"],
    ),
    (
        "time-negative",
        "name: t\nrun: [x]\nresources: {time: -5}\n",
        ["resources.time: expected a Slurm time, got '-5'"],
    ),
    (
        "time-word",
        "name: t\nrun: [x]\nresources: {time: soon}\n",
        ["resources.time: expected a Slurm time, got 'soon'"],
    ),
    # --- shell metacharacters where names are expected
    (
        "name-semicolon",
        "name: 'x; rm -rf ~'\nrun: [x]\n",
        ["tcloud.yaml:1:7: name: expected a name of letters, digits, _.-, got 'x; rm -rf ~'"],
    ),
    (
        "name-substitution",
        "name: $(id)\nrun: [x]\n",
        ["name: expected a name of letters, digits, _.-, got '$(id)'"],
    ),
    ("name-option", "name: -rf\nrun: [x]\n", ["name: expected a name of letters, digits, _.-"]),
    ("name-too-long", f"name: {'a' * 65}\nrun: [x]\n", ["name: expected a name of letters"]),
    (
        "env-name-semicolon",
        "name: t\nrun: [x]\nenvironment: {env: {'A;B': x}}\n",
        ["environment.env.A;B: expected a shell variable name"],
    ),
    (
        "env-name-substitution",
        "name: t\nrun: [x]\nenvironment: {env: {'$(id)': x}}\n",
        ["environment.env.$(id): expected a shell variable name"],
    ),
    (
        "env-name-space",
        "name: t\nrun: [x]\nenvironment: {env: {'A B': x}}\n",
        ["environment.env.A B: expected a shell variable name"],
    ),
    (
        "env-value-nul",
        'name: t\nrun: [x]\nenvironment: {env: {A: "x\\0y"}}\n',
        ["environment.env.A: expected text without NUL characters"],
    ),
    (
        "sbatch-option-injection",
        "name: t\nrun: [x]\nresources: {sbatch: {'x; rm -rf ~': '1'}}\n",
        ["resources.sbatch.x; rm -rf ~: expected an sbatch option name"],
    ),
    (
        "sbatch-option-dashes",
        "name: t\nrun: [x]\nresources: {sbatch: {--exclusive: ''}}\n",
        ["resources.sbatch.--exclusive: expected an sbatch option name"],
    ),
    (
        "partition-with-option",
        "name: t\nrun: [x]\nresources: {partition: batch --uid=0}\n",
        ["resources.partition: expected a Slurm name (letters, digits, _.+-), got 'batch --uid=0'"],
    ),
    (
        "account-substitution",
        "name: t\nrun: [x]\nresources: {account: $(whoami)}\n",
        ["resources.account: expected a Slurm name"],
    ),
    (
        "module-two-lines",
        'name: t\nrun: [x]\nenvironment: {modules: ["cuda\\nrm -rf ~"]}\n',
        ["environment.modules[0]: expected one line of text"],
    ),
    (
        "requirement-two-lines",
        'name: t\nrun: [x]\nenvironment: {requirements: ["numpy\\n--index-url http://evil"]}\n',
        ["environment.requirements[0]: expected one line of text"],
    ),
    (
        "dataset-name-traversal",
        "name: t\nrun: [x]\ndatasets: [{name: ../x, cluster: /d}]\n",
        ["datasets[0].name: expected a name of letters, digits, _.-, got '../x'"],
    ),
    # --- path traversal in what is uploaded and fetched
    (
        "include-parent",
        "name: t\nrun: [x]\ncode: {include: ['../secrets/**']}\n",
        ["code.include[0]: expected a path relative to the directory, without '..'"],
    ),
    (
        "exclude-absolute",
        "name: t\nrun: [x]\ncode: {exclude: [/etc/passwd]}\n",
        ["code.exclude[0]: expected a path relative to the directory"],
    ),
    (
        "outputs-parent",
        "name: t\nrun: [x]\noutputs: [../../.ssh]\n",
        ["outputs[0]: expected a path relative to the directory, without '..'"],
    ),
    (
        "outputs-home",
        "name: t\nrun: [x]\noutputs: [~/x]\n",
        ["outputs[0]: expected a path relative to the directory"],
    ),
    (
        "dataset-cluster-relative",
        "name: t\nrun: [x]\ndatasets: [{name: d, cluster: data}]\n",
        ["datasets[0].cluster: expected an absolute path on the cluster, got 'data'"],
    ),
    (
        "dataset-local-missing",
        "name: t\nrun: [x]\ndatasets: [{name: d, local: ./nowhere}]\n",
        ["datasets.d: local path does not exist"],
    ),
    (
        "workdir-missing",
        "name: t\nrun: [x]\ncode: {workdir: ./src}\n",
        ["code.workdir:", "is not a directory"],
    ),
    # --- legacy tuxiv.conf gets the same limits
    (
        "legacy-nodes-zero",
        "entrypoint: [x]\njob:\n  name: j\n  general: [nodes=0]\n",
        ["tuxiv.conf:1:1: job.general: 'nodes=0': expected an integer >= 1"],
    ),
    (
        "legacy-name-injection",
        "entrypoint: [x]\njob:\n  name: 'j; rm'\n",
        ["tuxiv.conf:3:9: job.name: expected a name of letters, digits, _.-"],
    ),
    (
        "legacy-env-name",
        "entrypoint: [x]\njob:\n  name: j\n  env: ['A B=1']\n",
        ["job.env.A B: expected a shell variable name"],
    ),
    (
        "legacy-unknown-key",
        "entrypoints: [x]\njob: {name: j}\n",
        ["entrypoints: unknown key (did you mean 'entrypoint'?)"],
    ),
]


@pytest.mark.parametrize(
    ("text", "fragments"),
    [(text, fragments) for _, text, fragments in TASK_FILE_CASES],
    ids=[case for case, *_ in TASK_FILE_CASES],
)
def test_bad_task_file_is_refused_before_the_cluster(tcloud, tmp_path, text, fragments):
    name = "tuxiv.conf" if "entrypoint" in str(text) else "tcloud.yaml"
    project = task_dir(tmp_path / "p", text, name)
    if "workdir" not in str(text) and "local:" not in str(text):
        (project / "train.py").write_text("print('hi')\n")
    stderr = tcloud.refused(tcloud("submit", str(project)), 3, *fragments)
    assert stderr.startswith("tcloud: error: ")
    assert f"{project}/{name}" in stderr or "datasets." in stderr or "code.workdir" in stderr


def test_sbatch_option_the_agent_owns_is_refused_with_the_file(tcloud, tmp_path):
    text = "name: t\nrun: [x]\nresources: {sbatch: {output: /tmp/x}}\n"
    project = task_dir(tmp_path / "p", text)
    for argv in (["submit"], ["submit", "--dry-run"]):
        tcloud.refused(
            tcloud(*argv, str(project)),
            3,
            f"{project}/tcloud.yaml:3:22: resources.sbatch.output: expected an option the agent "
            "leaves to the task: sbatch option 'output' cannot be set by a task",
        )


def test_metacharacters_in_values_are_kept_verbatim_never_run(tcloud, tmp_path):
    """Values may hold anything a shell would interpret: tcloud passes them on as data."""
    canary = tmp_path / "PWNED"
    danger = f"$(touch {canary}); `touch {canary}` | & > < * ? ' \" \\ #"
    task = {
        "name": "t",
        "run": [f"./my script.sh --x '$(y)' && echo {danger}"],
        "environment": {
            "env": {"DANGER": danger},
            "modules": [f"cuda; touch {canary}"],
            "requirements": [f"numpy; touch {canary}"],
        },
        "resources": {"sbatch": {"mail-user": danger}},
    }
    project = task_dir(tmp_path / "p", yaml.safe_dump(task))
    proc = tcloud("submit", "--dry-run", "--json", str(project))
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["instruction"]["task"]["environment"]["env"] == {"DANGER": danger}
    assert document["instruction"]["task"]["run"] == task["run"]
    assert f"--mail-user={danger}" in document["sbatch"]  # one argv word, no shell
    assert not canary.exists() and tcloud.sentinel.attempts == 0


def test_yaml_numbers_where_text_is_wanted_keep_the_text_as_written(tcloud, tmp_path):
    """YAML 1.1 reads an unquoted 1:30:00 as 5400 (base 60): that would be 5400 minutes."""
    text = "name: t\nrun: [x]\nresources: {time: 1:30:00}\nenvironment: {env: {LR: 0.10}}\n"
    proc = tcloud("submit", "--dry-run", "--json", str(task_dir(tmp_path / "p", text)))
    assert proc.returncode == 0, proc.stderr
    task = json.loads(proc.stdout)["instruction"]["task"]
    assert task["resources"]["time"] == "1:30:00" and task["environment"]["env"] == {"LR": "0.10"}
    hexadecimal = task_dir(tmp_path / "q", "name: t\nrun: [x]\nresources: {mem: 0x10}\n")
    tcloud.refused(
        tcloud("submit", str(hexadecimal)),
        3,
        "resources.mem: expected a size > 0 like 4G or 512M, got '0x10'",
    )


# --- what the task directory holds ---------------------------------------------------


def test_symlinks_out_of_the_directory_are_refused_and_named(tcloud, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    project = task_dir(tmp_path / "p", OK)
    (project / "key").symlink_to(outside / "secret.txt")
    (project / "data").symlink_to(outside)
    (project / "etc-passwd").symlink_to("/etc/passwd")
    (project / "up").symlink_to("../outside/secret.txt")  # relative, still outside
    stderr = tcloud.refused(tcloud("submit", str(project)), 3)
    for name, target in (
        ("key", outside / "secret.txt"),
        ("data", outside),
        ("etc-passwd", "/etc/passwd"),
        ("up", "../outside/secret.txt"),
    ):
        assert f"{project}/{name}: code: symlink to {target}, outside {project}" in stderr
    assert "exclude it (code.exclude or .tcloudignore)" in stderr


def test_dangling_and_looping_symlinks_are_refused(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    (project / "gone").symlink_to("nowhere")
    (project / "loop-a").symlink_to("loop-b")
    (project / "loop-b").symlink_to("loop-a")
    stderr = tcloud.refused(tcloud("submit", str(project)), 3)
    assert f"{project}/gone: code: symlink to nowhere, which does not exist" in stderr
    assert f"{project}/loop-a: code: symlink to loop-b, which does not exist" in stderr


def test_directory_symlink_inside_is_refused_file_symlink_is_uploaded_as_the_file(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    (project / "configs").mkdir()
    (project / "configs/base.yaml").write_text("lr: 0.1\n")
    (project / "config.yaml").symlink_to("configs/base.yaml")
    (project / "latest").symlink_to("configs")
    stderr = tcloud.refused(tcloud("submit", str(project)), 3)
    assert f"{project}/latest: code: symlink to the directory configs" in stderr
    assert "config.yaml" not in stderr
    (project / "latest").unlink()
    proc = tcloud("submit", "--dry-run", "--json", str(project))
    manifest = json.loads(proc.stdout)["instruction"]["manifest"]
    assert manifest["code/config.yaml"] == manifest["code/configs/base.yaml"]


def test_an_excluded_symlink_is_not_looked_at(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ncode: {exclude: [.venv/, key]}\n")
    (project / ".venv/bin").mkdir(parents=True)
    (project / ".venv/bin/python").symlink_to("/usr/bin/python3")
    (project / "key").symlink_to("/etc/passwd")
    proc = tcloud("submit", "--dry-run", "--json", str(project))
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stdout)["instruction"]["manifest"]) == ["code/tcloud.yaml"]


def test_escaping_symlink_in_a_local_dataset_is_refused(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ndatasets: [{name: d, local: ./d}]\n")
    (project / "d").mkdir()
    (project / "d/link").symlink_to("/etc/hostname")
    tcloud.refused(
        tcloud("submit", str(project)),
        3,
        f"{project}/d/link: datasets.d: symlink to /etc/hostname, outside",
    )


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space."""
    with path.open("wb") as handle:
        handle.truncate(size)
    return path


def test_huge_file_is_refused_before_it_is_read(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    sparse(project / "model.ckpt", 3 << 30)
    proc = tcloud("submit", str(project))
    tcloud.refused(
        proc,
        3,
        f"{project}/model.ckpt: code: 3.0 GiB is over the limit of 2G ($TCLOUD_MAX_FILE_SIZE)",
        "exclude it",
    )
    # Refused by its size alone, by the local checks before anything is hashed.
    assert not (tmp_path / "cache/hashes.sqlite").exists()


def test_file_size_limit_is_configurable(tcloud, tmp_path):
    project = task_dir(
        tmp_path / "p", "name: t\nrun: [x]\ndatasets: [{name: big, local: ./big.bin}]\n"
    )
    sparse(project / "big.bin", 3 << 20)
    small = {"TCLOUD_MAX_FILE_SIZE": "1M"}
    tcloud.refused(
        tcloud("submit", str(project), env=small),
        3,
        f"{project}/big.bin: code: 3.0 MiB is over the limit of 1M",
    )
    lifted = tcloud("submit", "--dry-run", str(project), env={"TCLOUD_MAX_FILE_SIZE": "unlimited"})
    assert lifted.returncode == 0, lifted.stderr
    tcloud.refused(
        tcloud("submit", str(project), env={"TCLOUD_MAX_FILE_SIZE": "lots"}),
        2,
        "TCLOUD_MAX_FILE_SIZE='lots': expected a size like 512M or 20G, or unlimited",
    )


def test_huge_file_in_a_local_dataset_is_refused(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ndatasets: [{name: d, local: ./d}]\n")
    (project / "d").mkdir()
    sparse(project / "d/huge.bin", (2 << 30) + 1)
    tcloud.refused(
        tcloud("submit", str(project)),
        3,
        f"{project}/d/huge.bin: datasets.d: 2.0 GiB is over the limit of 2G",
    )


def test_excluded_huge_file_is_fine(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ncode: {exclude: ['*.ckpt']}\n")
    sparse(project / "model.ckpt", 50 << 30)
    proc = tcloud("submit", "--dry-run", str(project))
    assert proc.returncode == 0, proc.stderr


def test_non_utf8_file_and_directory_names_are_refused(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    (project / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")
    (project / os.fsdecode(b"d\xffata")).mkdir()
    (project / os.fsdecode(b"d\xffata") / "a.txt").write_text("x\n")
    stderr = tcloud.refused(tcloud("submit", str(project)), 3)
    assert (
        f"{project}/caf\\xe9.txt: code: file name is not UTF-8; rename it or exclude it" in stderr
    )
    assert f"{project}/d\\xffata: code: directory name is not UTF-8" in stderr


def test_excluded_non_utf8_name_and_utf8_names_are_fine(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ncode: {exclude: ['*.tmp']}\n")
    (project / os.fsdecode(b"caf\xe9.tmp")).write_text("x\n")
    (project / "données-π.csv").write_text("x\n")
    proc = tcloud("submit", "--dry-run", "--json", str(project))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)["instruction"]["manifest"]
    assert sorted(manifest) == ["code/données-π.csv", "code/tcloud.yaml"]


def test_non_utf8_task_directory_is_hashed_and_goes_on(tcloud, tmp_path):
    """The hash cache keys paths that are not UTF-8 by their bytes: no crash; the
    submit goes on to the (unreachable) cluster."""
    project = task_dir(tmp_path / os.fsdecode(b"caf\xe9") / "p", OK)
    proc = tcloud("submit", str(project))
    assert proc.returncode == 4 and "cannot connect to 127.0.0.1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and tcloud.sentinel.attempts == 1


def test_unreadable_tcloudignore_is_named(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    (project / ".tcloudignore").write_bytes(b"caf\xe9/\n")
    tcloud.refused(
        tcloud("submit", str(project)), 3, f"{project}/.tcloudignore: cannot read: not UTF-8 text"
    )


def test_task_file_that_is_a_directory(tcloud, tmp_path):
    (tmp_path / "p/tcloud.yaml").mkdir(parents=True)
    tcloud.refused(tcloud("submit", str(tmp_path / "p")), 3, "no task file")
    tcloud.refused(tcloud("validate", str(tmp_path / "p/tcloud.yaml/")), 3, "no task file")


# --- command line, config and cache ---------------------------------------------------

CLI_CASES = [
    # (id, argv, exit code, fragments)
    ("job-id-injection", ["cancel", "12; rm -rf /"], 2, ["not a job id: 12; rm -rf /"]),
    ("job-id-traversal", ["download", "../../etc", "out"], 2, ["not a job id: ../../etc"]),
    ("job-id-status", ["status", "$(id)"], 2, ["not a job id: $(id)"]),
    (
        "logs-negative-tail",
        ["logs", "1", "--tail", "-3"],
        2,
        ["argument --tail: expected a whole number >= 0, got '-3'"],
    ),
    (
        "logs-node-word",
        ["logs", "1", "--node", "first"],
        2,
        ["argument --node: expected a whole number >= 0, got 'first'"],
    ),
    (
        "halt-grace-word",
        ["halt", "1", "--grace", "soon"],
        2,
        ["argument --grace: expected 0 to 3600 seconds, got 'soon'"],
    ),
    (
        "halt-grace-too-long",
        ["halt", "1", "--grace", "86400"],
        2,
        ["argument --grace: expected 0 to 3600 seconds, got '86400'"],
    ),
    (
        "cat-traversal",
        ["cat", "../../../etc/shadow"],
        2,
        ["path '../../../etc/shadow' is outside your cluster directory"],
    ),
    ("cat-absolute", ["cat", "/etc/shadow"], 2, ["path '/etc/shadow' is outside your cluster"]),
    ("ls-sneaky-traversal", ["ls", "files/../../other"], 2, ["is outside your cluster directory"]),
    ("ls-home", ["ls", "~root"], 2, ["is outside your cluster directory"]),
    (
        "config-port-range",
        ["config", "add", "x", "--host", "h", "--port", "70000"],
        2,
        ["argument --port: expected a port from 1 to 65535, got '70000'"],
    ),
    (
        "dashboard-port-range",
        ["dashboard", "--port", "70000"],
        2,
        ["argument --port: expected a port from 0 to 65535, got '70000'"],
    ),
    (
        "dashboard-port-word",
        ["dashboard", "--port", "web"],
        2,
        ["argument --port: expected a port from 0 to 65535, got 'web'"],
    ),
    (
        "init-bad-name",
        ["init", "{tmp}/proj", "--name", "my job; rm -rf ~"],
        2,
        ["--name 'my job; rm -rf ~': expected a name of letters, digits, _.-"],
    ),
]


@pytest.mark.parametrize(
    ("argv", "code", "fragments"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_bad_command_line_is_refused_before_the_cluster(tcloud, tmp_path, argv, code, fragments):
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    tcloud.refused(tcloud(*argv, cwd=tmp_path), code, *fragments)
    assert not (tmp_path / "proj").exists() and not (tmp_path / "out").exists()


def test_upload_remote_name_out_of_the_directory(tcloud, tmp_path):
    (tmp_path / "notes.txt").write_text("x\n")
    for name in ("../escape", "/etc/cron.d/x", "files/../../x"):
        tcloud.refused(
            tcloud("upload", str(tmp_path / "notes.txt"), name),
            2,
            f"NAME {name!r} is outside your cluster directory",
        )


def test_upload_of_a_tree_with_escaping_symlink_or_bad_name(tcloud, tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ok.txt").write_text("x\n")
    (tree / "shadow").symlink_to("/etc/shadow")
    tcloud.refused(
        tcloud("upload", str(tree)),
        2,
        f"{tree}/shadow: upload: symlink to /etc/shadow, outside {tree}",
        "move it out of the directory",
    )
    (tree / "shadow").unlink()
    (tree / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")
    tcloud.refused(
        tcloud("upload", str(tree)), 2, f"{tree}/caf\\xe9.txt: upload: file name is not UTF-8"
    )
    tcloud.refused(tcloud("upload", str(tmp_path / "nothing-here")), 2, "does not exist")


CONFIG_CASES = [
    # (id, config file text, fragments)
    (
        "config-port-word",
        "current: lab\nclusters:\n  lab: {host: h, port: abc}\n",
        ["cluster 'lab': port must be a number from 1 to 65535, got 'abc'"],
    ),
    (
        "config-entry-not-mapping",
        "current: lab\nclusters:\n  lab: 5\n",
        ["cluster 'lab': expected a mapping of settings"],
    ),
    (
        "config-unknown-setting",
        "current: lab\nclusters:\n  lab: {host: h, hots: x}\n",
        ["cluster 'lab': unknown settings hots"],
    ),
    (
        "config-no-host",
        "current: lab\nclusters:\n  lab: {user: alice}\n",
        ["cluster 'lab': needs a host"],
    ),
    (
        "config-host-list",
        "current: lab\nclusters:\n  lab: {host: [a, b]}\n",
        ["cluster 'lab': host must be text"],
    ),
    ("config-bad-yaml", "current: lab\nclusters: {lab: {host: h}\n", ["not valid YAML"]),
    ("config-not-utf8", b"current: caf\xe9\n", ["not UTF-8 text"]),
    ("config-clusters-list", "clusters: [lab]\n", ["expected a mapping with 'clusters'"]),
]


@pytest.mark.parametrize(
    ("text", "fragments"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_bad_cluster_config_is_named(tcloud, text, fragments):
    tcloud.config.write_bytes(text if isinstance(text, bytes) else text.encode())
    tcloud.refused(tcloud("ps"), 4, str(tcloud.config), *fragments)


def test_config_that_is_a_directory(tcloud, tmp_path):
    tcloud.refused(
        tcloud("ps", env={"TCLOUD_CONFIG": str(tmp_path)}),
        4,
        f"{tmp_path}: cannot read: Is a directory",
    )


def test_corrupt_hash_cache_is_started_afresh(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache/hashes.sqlite").write_bytes(b"this is not a database" * 100)
    proc = tcloud("submit", str(project))
    # Hashing worked (the cache was rebuilt); the unreachable cluster is the only error.
    assert proc.returncode == 4 and "cannot connect to 127.0.0.1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "cache/hashes.sqlite").read_bytes().startswith(b"SQLite format 3")


def test_unusable_hash_cache_directory_is_named(tcloud, tmp_path):
    project = task_dir(tmp_path / "p", OK)
    (tmp_path / "not-a-dir").write_text("x")
    tcloud.refused(
        tcloud("submit", str(project), env={"TCLOUD_CACHE_DIR": str(tmp_path / "not-a-dir")}),
        4,
        "hash cache",
        "set TCLOUD_CACHE_DIR to a writable directory",
    )


def test_a_cluster_that_does_not_speak_ssh(tcloud, tmp_path):
    """The control for every case above: a valid command does reach the sentinel."""
    proc = tcloud("ps")
    assert proc.returncode == 4, proc.stderr
    assert f"cannot connect to 127.0.0.1:{tcloud.sentinel.port}" in proc.stderr
    assert "Traceback" not in proc.stderr and tcloud.sentinel.attempts == 1
