#!/usr/bin/env python3
"""`make gpu-check`: the project's GPU-facing code against a real GPU (not in `make test`:
CI has no GPU). Run it on a GPU machine, e.g. the one the device tool lends; it needs no
venv and no network: the machine's Python (PyYAML for the agent's config and tcloud,
torch for the last check), nvidia-smi and, for the PCI side, lspci. The pure-Python
libraries the sources need beyond those (PURE_PYTHON) travel in .cache/gpu-check-site:
`make gpu-check-bundle` fills it from the venv; carry it to the GPU machine.

One report line per check, "PASS|FAIL|SKIP name: detail", details indented below it:

1. agent gpu check: the agent's GPU check (tacc_agent/checks/gpu.py, as `tacc-agent
   check` runs it) against the real nvidia-smi, expecting the GPUs `nvidia-smi -L` lists.
2. nvidia_gpu_facts: the nvidia_gpu role's module run on this machine (its main(), with a
   stand-in for AnsibleModule, so Ansible need not be installed): GPU count, names, driver
   version, PCI ids and the Slurm Gres it derives.
3. fake vs real nvidia-smi (and lspci): every nvidia-smi invocation the project makes, run
   on the real tool and on the lab's FAKE (tacc_lab/fakes) with a fake state of the same
   GPU count and model, compared field by field: exit code, columns, field names, value
   shapes (number, decimals, unit, [N/A], text), never the values. Each difference is a
   FAIL naming the field. Both outputs go to gpu-check/fake-vs-real.json under $OUT (the
   device tool returns what is written there), else under .cache/.
4. torchrun + NCCL through the exec wrapper: examples/pytorch-ddp/train.py as a job (tcloud
   compile + the agent's store, no SSH) run by `python3 -m tacc_agent exec JOBDIR` with
   launcher torchrun, one process per GPU; passes when it exits 0 and every rank's log
   shows backend nccl on a cuda device and the loss falls.
5. acceptance torch pair: what `tacc-agent accept` runs between two nodes
   (tacc_agent/health/accept_probe.py torch), here as two local processes standing in for
   the node and its peer, each given one GPU (CUDA_VISIBLE_DEVICES, as --gres=gpu:1 does):
   NCCL where there are two GPUs, gloo on the CPU where there is one (NCCL needs a GPU
   per rank); passes when both ranks agree on the step's token and rank 0 reports the
   bus bandwidth.

Exit status: 0 nothing failed, 1 something failed, 2 no nvidia-smi here (all skipped).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]
# Runs from a checkout without a venv (the GPU machine has no network): the source of
# each distribution under packages/ goes on the path.
DISTRIBUTIONS = ("contract", "plugins", "client", "agent", "ops")
SOURCE_DIRS = [str(ROOT / "packages" / dist) for dist in DISTRIBUTIONS]
# The pure-Python libraries the sources import beyond the standard library, PyYAML and
# torch, which a GPU machine without network lacks: `make gpu-check-bundle` copies them
# from the venv into BUNDLE, and the device tool carries it (carry: [.cache/gpu-check-site]).
PURE_PYTHON = ("dockerfile_parse",)
BUNDLE = ROOT / ".cache" / "gpu-check-site"
if BUNDLE.is_dir():
    SOURCE_DIRS.append(str(BUNDLE))
for _source in SOURCE_DIRS:
    if _source not in sys.path:
        sys.path.insert(0, _source)
if not importlib.metadata.entry_points(group="tacc.plugins"):
    # No installed metadata (no venv here): the built-in plug-ins by module path, as a
    # researcher's $TACC_PLUGINS names them; the agent's exec inherits it. LAS is off by
    # default, and naming a module turns it on, so it stays out.
    from tacc_plugins import BUILTIN

    os.environ["TACC_PLUGINS"] = ",".join(m for m in BUILTIN if m != "tacc_plugins.las")

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
NO_SMI = "no nvidia-smi on this machine: run it on a GPU machine (the device tool)"
CHECKS = {  # --only key -> report name
    "agent": "agent gpu check",
    "facts": "nvidia_gpu_facts",
    "compare": "fake vs real nvidia-smi",
    "torchrun": "torchrun + NCCL through the exec wrapper",
    "accept": "acceptance torch pair",
}
ACCEPT_PROBE = ROOT / "packages" / "agent" / "tacc_agent" / "health" / "accept_probe.py"
ACCEPT_WORDS = ("--mib", "64", "--iterations", "20", "--timeout", "120")
TOOL_TIMEOUT = 30.0  # one nvidia-smi or lspci call
TRAIN_TIMEOUT = 300.0
FAKES = ROOT / "packages" / "ops" / "tacc_lab" / "fakes"
FACTS_MODULE = ROOT / "roles" / "nvidia_gpu" / "library" / "nvidia_gpu_facts.py"
TRAIN = ROOT / "examples" / "pytorch-ddp" / "train.py"
TRAIN_LINE = "train.py --epochs 2 --samples 65536"
LIST_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (\S+)\)$")
LSPCI_LINE = re.compile(r"^(\S+) (\S+): (\S+?):(\S+?)(?: \(rev (\S+)\))?$")


# ---------------------------------------------------------------- report and commands
@dataclass
class Line:
    status: str
    name: str
    detail: str
    more: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"{self.status} {self.name}: {self.detail}"
        return "\n".join([head, *(f"    {m}" for m in self.more)])


@dataclass(frozen=True)
class Output:
    rc: int | None  # None: not found, not started or timed out
    stdout: str
    stderr: str = ""

    def record(self) -> dict:
        return {"rc": self.rc, "stdout": self.stdout, "stderr": self.stderr}


def run(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = TOOL_TIMEOUT
) -> Output:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
            errors="replace",
        )
    except FileNotFoundError:
        return Output(None, "", f"{argv[0]} not found")
    except subprocess.TimeoutExpired:
        return Output(None, "", f"{argv[0]} did not answer within {timeout:g} s")
    except OSError as exc:
        return Output(None, "", f"{argv[0]}: {exc}")
    return Output(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class Tool:
    """A command line to run a tool with extra arguments: the real one or a FAKE."""

    argv: tuple[str, ...]
    env: dict[str, str] | None = None

    def __call__(self, *args: str) -> Output:
        return run([*self.argv, *args], self.env)


def fake_tool(script: str, state_file: Path) -> Tool:
    """tacc_lab/fakes/<script>.py on a given fake state (as the lab's wrappers run it)."""
    env = {**os.environ, "TACC_FAKE_HW_STATE": str(state_file)}
    return Tool((sys.executable, str(FAKES / f"{script}.py")), env)


def listed_gpus(text: str) -> list[dict[str, str]]:
    """`nvidia-smi -L` lines as [{index, name, uuid}]."""
    found = (LIST_LINE.match(line.strip()) for line in text.splitlines())
    return [{"index": m[1], "name": m[2], "uuid": m[3]} for m in found if m]


def record_dir() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu-check" if out else ROOT / ".cache" / "gpu-check"


# ---------------------------------------------------------------- 1. the agent's check
def labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}" if pairs else ""


def agent_gpu_check(smi: str, expected: int) -> list[Line]:
    name = CHECKS["agent"]
    from tacc_agent.health.checks.base import OK, timed
    from tacc_agent.health.checks.gpu import check_gpus

    try:
        from tacc_agent.config import AgentConfig
        from tacc_agent.health.cycle import boot_id

        config = AgentConfig(nvidia_smi=smi, expected_gpus=expected)
        timeout, kernel_log = config.check_timeout_seconds, config.kernel_log
        booted, note = boot_id(config.proc_root), ""
    except ImportError as exc:  # tacc_agent.config needs PyYAML
        timeout, kernel_log, booted = 5.0, "/dev/kmsg", ""
        note = f"; AgentConfig not importable ({exc}: PyYAML missing?), its defaults used"
    if not os.access(kernel_log, os.R_OK):
        note += f"; kernel log {kernel_log} unreadable here: Xids not scanned"
    # A fresh Xid state: this run must not touch the node's /var/lib/tacc-agent.
    result = timed("gpu", lambda: check_gpus(smi, expected, kernel_log, {}, timeout, booted))
    more = [f"{s.name}{labels(s.labels)} = {s.value:g}" for s in result.samples]
    detail = f"status {result.status} in {result.seconds:.2f} s: {result.detail}{note}"
    status = PASS if result.status == OK else FAIL
    if status == PASS and not any(s.name == "gpu_temperature_celsius" for s in result.samples):
        status = FAIL
        detail += "; no per-GPU figures: nvidia-smi rejected the figures query"
    return [Line(status, name, detail, more)]


# ---------------------------------------------------------------- 2. nvidia_gpu_facts
class ModuleDone(Exception):
    def __init__(self, failed: bool, result: dict) -> None:
        super().__init__(result.get("msg", ""))
        self.failed, self.result = failed, result


class StubModule:
    """Just what nvidia_gpu_facts.main() uses of AnsibleModule, so no Ansible is needed."""

    paths: ClassVar[dict[str, str | None]] = {}  # tool -> path; unset: looked up on PATH

    def __init__(self, argument_spec: dict, supports_check_mode: bool = False) -> None:
        self.params = {key: spec.get("default") for key, spec in argument_spec.items()}

    def get_bin_path(self, name: str, required: bool = False) -> str | None:
        found = self.paths[name] if name in self.paths else shutil.which(name)
        if found is None and required:
            self.fail_json(msg=f"{name} not found")
        return found

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        out = run(argv)
        return (127 if out.rc is None else out.rc), out.stdout, out.stderr

    def exit_json(self, **result) -> None:
        raise ModuleDone(False, result)

    def fail_json(self, **result) -> None:
        raise ModuleDone(True, result)


def load_facts_module() -> types.ModuleType:
    """roles/nvidia_gpu/library/nvidia_gpu_facts.py, importable without Ansible (a stand-in
    ansible.module_utils.basic while it loads) and with StubModule as its AnsibleModule."""
    saved = {}
    if importlib.util.find_spec("ansible") is None:
        for dotted in ("ansible", "ansible.module_utils", "ansible.module_utils.basic"):
            saved[dotted] = sys.modules.get(dotted)
            sys.modules[dotted] = types.ModuleType(dotted)
        sys.modules["ansible.module_utils.basic"].AnsibleModule = StubModule  # type: ignore[attr-defined]
    try:
        spec = importlib.util.spec_from_file_location("nvidia_gpu_facts", FACTS_MODULE)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        for dotted, before in saved.items():
            if before is None:
                sys.modules.pop(dotted, None)
            else:
                sys.modules[dotted] = before
    module.AnsibleModule = StubModule  # type: ignore[attr-defined]
    return module


def run_facts_module(module: types.ModuleType, smi: str | None) -> ModuleDone:
    StubModule.paths = {"nvidia-smi": smi}
    try:
        module.main()
    except ModuleDone as done:
        return done
    return ModuleDone(True, {"msg": "the module ended without exit_json or fail_json"})


def gpu_facts(smi: str, expected: int) -> list[Line]:
    name = CHECKS["facts"]
    module = load_facts_module()
    done = run_facts_module(module, smi)
    if done.failed and "lspci not found" in str(done):
        # The PCI side cannot run here; the nvidia-smi side still can.
        out = run([smi, f"--query-gpu={module.SMI_FIELDS}", "--format=csv,noheader,nounits"])
        rows = module.parse_smi(out.stdout) if out.rc == 0 else []
        more = [
            f"GPU {r['index']}: {r['name']}, {r['memory_mib']} MiB, pci {r['pci']}, "
            f"driver {r['driver_version']}, {r['uuid']}"
            for r in rows
        ]
        ok = out.rc == 0 and len(rows) == expected
        detail = (
            f"nvidia-smi side only (parse_smi): {len(rows)} of {expected} GPU(s), gres "
            f"type {module.gres_type(rows[0]['name']) if rows else '-'}"
            if ok
            else f"parse_smi: {len(rows)} row(s) of {expected} GPU(s) from "
            f"nvidia-smi (exit {out.rc}) {out.stderr.strip()}"
        )
        return [
            Line(
                SKIP,
                f"{name} lspci",
                "lspci not found on this machine (pciutils): "
                "the module's PCI side (count, PCI ids, NVSwitches) not run",
            ),
            Line(PASS if ok else FAIL, name, detail, more),
        ]
    if done.failed:
        return [Line(FAIL, name, f"the module failed: {done}")]
    facts = done.result["ansible_facts"]["nvidia_gpu"]
    more = [
        f"count {facts['count']}, pci {facts['pci']}, nvswitch_count {facts['nvswitch_count']}",
        f"driver_loaded {facts['driver_loaded']}, driver_version {facts['driver_version']}",
        f"models {facts['models']}, gres_type {facts['gres_type']}, gres {facts['gres']}",
        *(
            f"GPU {d['index']}: {d['name']}, {d['memory_mib']} MiB, pci {d['pci']}, {d['uuid']}"
            for d in facts["devices"]
        ),
    ]
    problems = []
    if facts["count"] != expected:
        problems.append(f"lspci finds {facts['count']} GPU(s), nvidia-smi -L lists {expected}")
    if not facts["driver_loaded"] or len(facts["devices"]) != expected:
        problems.append(f"{len(facts['devices'])} nvidia-smi row(s) parsed, expected {expected}")
    unmatched = sorted({d["pci"] for d in facts["devices"]} - set(facts["pci"]))
    if unmatched:
        problems.append(f"nvidia-smi bus ids {unmatched} not among lspci's {facts['pci']}")
    if not facts["driver_version"]:
        problems.append("no driver version")
    if facts["gres_type"] in ("", "gpu"):
        problems.append(f"no Gres type derived from the model names {facts['models']}")
    if problems:
        return [Line(FAIL, name, "; ".join(problems), more)]
    return [Line(PASS, name, f"{facts['count']} GPU(s), Gres {facts['gres']}", more)]


# ---------------------------------------------------------------- 3. fake vs real
NUMBER = re.compile(r"(-?\d+)(?:\.(\d+))?( ?)(%|[A-Za-z]+)?")
SHAPES = (
    ("uuid", re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")),
    ("bus id (8-digit domain, upper)", re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")),
    ("pci address (4-digit domain)", re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")),
    ("version x.y.z", re.compile(r"\d+\.\d+\.\d+")),
    ("Yes/No", re.compile(r"Yes|No")),
)
WORDS = {
    "On": "On/Off",
    "Off": "On/Off",
    "Enabled": "Enabled/Disabled",
    "Disabled": "Enabled/Disabled",
    "Default": "<compute mode>",
    "Exclusive_Process": "<compute mode>",
    "Prohibited": "<compute mode>",
}


def shape(value: str | None, hex_ids: bool = False) -> str:
    """What a value looks like, not what it is: "81559 MiB" -> "integer MiB". With
    `hex_ids` (lspci -n), 4 hex digits are an id or class: 2330 and 20b2 alike."""
    if value is None:
        return "missing"
    value = value.strip()
    if not value:
        return "empty"
    if (value.startswith("[") and value.endswith("]")) or value == "N/A":
        return value  # [N/A], [Not Supported], [Unknown Error]: said as such
    if hex_ids and re.fullmatch(r"[0-9a-f]{4}", value):
        return "4 hex digits"
    for name, pattern in SHAPES:
        if pattern.fullmatch(value):
            return name
    number = NUMBER.fullmatch(value)
    if number:
        kind = f"{len(number[2])}-decimal number" if number[2] else "integer"
        return f"{kind}{number[3]}{number[4]}" if number[4] else kind
    return "text"


@dataclass(frozen=True)
class Invocation:
    label: str
    args: tuple[str, ...]
    fields: tuple[str, ...] = ()  # names of the columns (CSV queries, -L, lspci)
    kind: str = "csv"  # csv (with header when the format says so) | list | lspci | table


def csv_invocation(label: str, fields: str, fmt: str) -> Invocation:
    names = tuple(f.strip() for f in fields.split(","))
    return Invocation(label, (f"--query-gpu={fields}", f"--format={fmt}"), names)


def smi_invocations() -> list[Invocation]:
    """Each way the project calls nvidia-smi, plus every field the fake knows with header
    and units, and the summary table the lab shows."""
    from tacc_agent.health.checks.gpu import FIGURE_FIELDS
    from tacc_lab.fakes.nvidia_smi import FIELDS

    facts = load_facts_module()
    return [
        Invocation("-L (docs/lab.md)", ("-L",), ("index", "name", "uuid"), "list"),
        # tacc_agent/checks/gpu.py check_gpus (its query is written in place there).
        csv_invocation("agent check", "index,pci.bus_id", "csv,noheader"),
        csv_invocation("agent figures", FIGURE_FIELDS, "csv,noheader,nounits"),
        csv_invocation("nvidia_gpu_facts", facts.SMI_FIELDS, "csv,noheader,nounits"),
        csv_invocation("all fake fields, header and units", ",".join(FIELDS), "csv"),
        Invocation("summary table (no arguments)", (), (), "table"),
    ]


LSPCI = Invocation(
    "lspci -D -n -d 10de: (nvidia_gpu_facts)",
    ("-D", "-n", "-d", "10de:"),
    ("pci address", "class", "vendor", "device", "rev"),
    "lspci",
)


def rows(inv: Invocation, text: str) -> tuple[list[str] | None, list[list[str]]]:
    """(header cells or None, data rows as cells) of one output."""
    lines = [line for line in text.splitlines() if line.strip()]
    if inv.kind == "list":
        return None, [list(m.groups()) if (m := LIST_LINE.match(x.strip())) else [x] for x in lines]
    if inv.kind == "lspci":
        return None, [
            [g or "" for g in m.groups()] if (m := LSPCI_LINE.match(x.strip())) else [x]
            for x in lines
        ]
    cells = [line.split(", ") for line in lines]
    if "noheader" in inv.args[-1]:
        return None, cells
    return (cells[0] if cells else []), cells[1:]


def table_lines(text: str, names: list[str]) -> list[str]:
    """The summary table as layout: each line's width, its cells with numbers as 9, GPU
    names as <name> and state words by kind; the first line (the time stamp) keeps its
    spacing, digit for digit and letter for letter (the day and month names change with
    the date), less trailing blanks."""
    found = []
    for number, line in enumerate(text.splitlines()):
        if number == 0:
            found.append(re.sub(r"[A-Za-z]", "a", re.sub(r"\d", "9", line.rstrip())))
            continue
        width = len(line)
        for gpu_name in sorted(names, key=len, reverse=True):
            line = line.replace(gpu_name, "<name>")
        cells = []
        for cell in line.split("|"):
            words = [WORDS.get(w, re.sub(r"\d+(\.\d+)*", "9", w)) for w in cell.split()]
            cells.append(" ".join(words))
        found.append(f"{' | '.join(cells)}   [width {width}]")
    return found


def compare(
    inv: Invocation, real: Output, fake: Output, names: tuple[list[str], list[str]] | None = None
) -> list[str]:
    """Every way the fake's output differs in form from the real one's, each naming the
    field (a data row's column, a header cell, a table line); [] when alike."""
    if real.rc != fake.rc:
        return [
            f"exit code: real {real.rc} ({real.stderr.strip()[:80]}), "
            f"fake {fake.rc} ({fake.stderr.strip()[:80]})"
        ]
    if real.rc != 0:
        return []  # both refused the same way
    if inv.kind == "table":
        real_names, fake_names = names or ([], [])
        real_lines = table_lines(real.stdout, real_names)
        fake_lines = table_lines(fake.stdout, fake_names)
        return [
            f"line {n + 1}: real {r!r}, fake {f!r}"
            for n, (r, f) in enumerate(itertools.zip_longest(real_lines, fake_lines))
            if r != f
        ]
    problems: dict[tuple, str] = {}  # one report per field and kind of difference
    real_head, real_rows = rows(inv, real.stdout)
    fake_head, fake_rows = rows(inv, fake.stdout)

    def field_name(i: int) -> str:
        return inv.fields[i] if i < len(inv.fields) else f"column {i + 1}"

    if real_head is not None or fake_head is not None:
        for i, (r, f) in enumerate(itertools.zip_longest(real_head or [], fake_head or [])):
            if r != f:
                problems[("header", i)] = (
                    f"header of field {field_name(i)!r}: real {r!r}, fake {f!r}"
                )
    if len(real_rows) != len(fake_rows):
        problems[("rows",)] = f"rows: real {len(real_rows)}, fake {len(fake_rows)}"
    for n, (r, f) in enumerate(zip(real_rows, fake_rows, strict=False)):
        if len(r) != len(f):
            problems.setdefault(
                ("columns", len(r), len(f)), f"row {n}: real {len(r)} columns, fake {len(f)}"
            )
        for i, (rv, fv) in enumerate(itertools.zip_longest(r, f)):
            hex_ids = inv.kind == "lspci"
            real_shape, fake_shape = shape(rv, hex_ids), shape(fv, hex_ids)
            if real_shape != fake_shape:
                problems.setdefault(
                    ("field", i, real_shape, fake_shape),
                    f"field {field_name(i)!r} (row {n}): real {rv!r} ({real_shape}), "
                    f"fake {fv!r} ({fake_shape})",
                )
    return list(problems.values())


def compare_tools(
    real: Tool,
    fake: Tool,
    invocations: list[Invocation],
    names: tuple[list[str], list[str]] | None = None,
) -> tuple[list[str], list[dict]]:
    """(differences as "invocation: field ...", a record of both outputs per invocation)."""
    differences, record = [], []
    for inv in invocations:
        real_out, fake_out = real(*inv.args), fake(*inv.args)
        found = compare(inv, real_out, fake_out, names)
        differences += [f"{inv.label}: {problem}" for problem in found]
        record.append(
            {
                "label": inv.label,
                "args": list(inv.args),
                "real": real_out.record(),
                "fake": fake_out.record(),
                "differences": found,
            }
        )
    return differences, record


def real_versions(smi: str) -> dict[str, str]:
    """The driver and CUDA versions in the real summary table's header ({} if none)."""
    header = run([smi]).stdout
    found = re.search(r"Driver Version: (\S+)\s+CUDA Version: (\S+)", header)
    return {"driver_version": found[1], "cuda_version": found[2]} if found else {}


def fake_state(gpus: list[dict[str, str]], versions: dict[str, str]) -> dict:
    """A fake node with as many GPUs, of the same model and driver series, as the real one:
    the fake prints the table layout of the driver series it is given."""
    from tacc_lab.fakehw import GPU_MODELS, FakeHardware, device_state

    names = " ".join(g["name"] for g in gpus).lower()
    model = next((key for key in GPU_MODELS if key in names), "h100")
    hardware = FakeHardware(gpus=max(len(gpus), 1), gpu_model=model)
    return {**device_state(hardware, socket.gethostname()), **versions}


def fake_vs_real(smi: str, gpus: list[dict[str, str]], out_dir: Path) -> list[Line]:
    name = CHECKS["compare"]
    state = fake_state(gpus, real_versions(smi))
    lines = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-fake-") as tmp:
        state_file = Path(tmp) / "state.json"
        state_file.write_text(json.dumps(state))
        names = ([g["name"] for g in gpus], [g["name"] for g in state["gpus"]])
        invocations = smi_invocations()
        differences, record = compare_tools(
            Tool((smi,)), fake_tool("nvidia_smi", state_file), invocations, names
        )
        lspci, lspci_differences = shutil.which("lspci"), []
        if lspci:
            lspci_differences, lspci_record = compare_tools(
                Tool((lspci,)), fake_tool("lspci", state_file), [LSPCI]
            )
            record += lspci_record
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "fake-vs-real.json"
    path.write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "time": time.time(),
                "real": smi,
                "fake_state": state,
                "invocations": record,
            },
            indent=1,
        )
        + "\n"
    )
    lines += [Line(FAIL, name, difference) for difference in differences]
    if not differences:
        faked = f"{len(gpus)} x {state['gpus'][0]['name']} faked"
        detail = f"{len(invocations)} invocations alike in form ({faked}); record {path}"
        lines.append(Line(PASS, name, detail))
    else:
        lines.append(Line(FAIL, name, f"{len(differences)} difference(s); both outputs in {path}"))
    lspci_name = "fake vs real lspci"
    if not lspci:
        lines.append(Line(SKIP, lspci_name, "lspci not found on this machine (pciutils)"))
    elif lspci_differences:
        lines += [Line(FAIL, lspci_name, difference) for difference in lspci_differences]
    else:
        lines.append(Line(PASS, lspci_name, f"{LSPCI.label} alike in form"))
    return lines


# ---------------------------------------------------------------- 4. torchrun + NCCL
def make_job(tmp: Path, gpus: int) -> Path:
    """A committed job directory for train.py, as tests/unit/agent_jobs.py builds one."""
    import yaml

    from tacc_agent.tasks.schedule import instruction as agent_instruction
    from tacc_agent.tasks.store import delta as store
    from tcloud.compile.compiler import compile_task
    from tcloud.compile.task_file import load_task

    project = tmp / "project"
    project.mkdir()
    shutil.copy2(TRAIN, project / "train.py")
    task = {
        "name": "gpu-check",
        "resources": {"nodes": 1, "gpus_per_node": gpus},
        "runtime": {"launcher": "torchrun"},
        "run": [TRAIN_LINE],
    }
    (project / "tcloud.yaml").write_text(yaml.safe_dump(task))
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    if os.environ.get("TACC_PLUGINS"):  # as the agent's CLI does with its config's plugins
        agent_instruction.configure(os.environ["TACC_PLUGINS"].split(","))
    user_dir = tmp / "workspace" / "user"
    user_dir.mkdir(parents=True, mode=0o700)
    return Path(store.commit_local(user_dir, instruction)["workdir"])


def agent_env(tmp: Path) -> dict[str, str]:
    """A temporary agent config (JSON is YAML) and no SLURM_* variables: one node, no Slurm."""
    (tmp / "no-sysfs").mkdir()
    config = {
        "workspace": str(tmp / "workspace"),
        "rdma_sysfs_root": str(tmp / "no-sysfs"),
        "facts_file": str(tmp / "facts.json"),
        "state_dir": str(tmp / "state"),
        "python": sys.executable,
    }
    if os.environ.get("TACC_PLUGINS"):  # no installed metadata: the built-ins by path
        config["plugins"] = os.environ["TACC_PLUGINS"].split(",")
    (tmp / "agent.yaml").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TACC_VENV"}
    path = os.pathsep.join(p for p in (*SOURCE_DIRS, env.get("PYTHONPATH", "")) if p)
    return {**env, "TACC_AGENT_CONFIG": str(tmp / "agent.yaml"), "PYTHONPATH": path}


def torch_facts() -> tuple[bool, str]:
    code = (
        "import torch; c = torch.cuda.is_available(); print(torch.__version__, "
        "torch.version.cuda, c, torch.cuda.device_count(), "
        "torch.cuda.nccl.version() if c else None)"
    )
    out = run([sys.executable, "-c", code], timeout=120)
    words = out.stdout.split()
    cuda = out.rc == 0 and len(words) > 2 and words[2] == "True"
    text = " ".join(words) if out.rc == 0 else out.stderr.strip()[-200:]
    return cuda, f"torch {text} (version, CUDA, available, devices, NCCL)"


def run_agent(job_dir: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """`python3 -m tacc_agent exec JOBDIR`; past the timeout: TERM (the agent stops its
    program), then KILL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tacc_agent", "exec", str(job_dir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output = proc.communicate(timeout=timeout)[0]
        return proc.returncode, output or ""
    except subprocess.TimeoutExpired:
        pass
    for number, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, number)  # the agent's own group: it started it
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        output = proc.communicate(timeout=10)[0]
    except (subprocess.TimeoutExpired, ValueError, OSError):
        output = ""
    return None, output or ""


def judge_logs(logs: dict[int, str], world: int) -> list[str]:
    """What is wrong with the rank logs of a torchrun run of train.py ([] when nothing)."""
    problems = []
    for rank in range(world):
        text = logs.get(rank)
        if text is None:
            problems.append(f"no log for rank {rank}")
            continue
        pattern = rf"rank {rank}/{world} \(local \d+\) on \S+: cuda(:\d+)?, backend nccl"
        if not re.search(pattern, text):
            problems.append(f"rank {rank}: no line 'rank {rank}/{world} ... cuda:N, backend nccl'")
    rank0 = logs.get(0, "")
    first = [float(x) for x in re.findall(r"epoch 1 first step: loss ([-+.\deE]+)", rank0)]
    epochs = [float(x) for x in re.findall(r"epoch \d+/\d+ loss ([-+.\deE]+)", rank0)]
    if len(epochs) != 2 or not first:
        problems.append(f"rank 0: {len(epochs)} epoch loss line(s) of 2, first step loss {first}")
    elif not (epochs[1] < epochs[0] < first[0]):
        problems.append(f"loss does not fall: first step {first[0]}, epochs {epochs}")
    return problems


def torchrun_check(gpus: int, out_dir: Path, timeout: float = TRAIN_TIMEOUT) -> list[Line]:
    name = CHECKS["torchrun"]
    if importlib.util.find_spec("torch") is None:
        return [Line(SKIP, name, f"torch is not importable by {sys.executable}")]
    if importlib.util.find_spec("yaml") is None:
        return [Line(SKIP, name, "PyYAML missing: tcloud and the agent's config need it")]
    cuda, about = torch_facts()
    if not cuda:
        return [Line(FAIL, name, f"torch sees no CUDA GPU: {about}")]
    return [run_training(gpus, out_dir, timeout, [about])]


def run_training(gpus: int, out_dir: Path, timeout: float, notes: list[str]) -> Line:
    """train.py through `tacc_agent exec` with launcher torchrun, judged by its rank logs
    (kept in out_dir/torchrun-logs)."""
    name = CHECKS["torchrun"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-job-") as name_tmp:
        tmp = Path(name_tmp)
        job_dir = make_job(tmp, gpus)
        env = agent_env(tmp)
        if not shutil.which("torchrun", path=env.get("PATH")):
            shim = tmp / "bin" / "torchrun"
            shim.parent.mkdir()
            shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
            shim.chmod(0o755)
            env["PATH"] = f"{shim.parent}{os.pathsep}{env.get('PATH', '')}"
            notes = [*notes, f"no torchrun on PATH: {shim} runs python -m torch.distributed.run"]
        started = time.monotonic()
        code, output = run_agent(job_dir, env, timeout)
        seconds = time.monotonic() - started
        logs, more = {}, [*notes, f"job {job_dir}, line {TRAIN_LINE!r}"]
        kept = out_dir / "torchrun-logs"
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for path in sorted((job_dir / "logs").glob("rank-*.log")):
            text = path.read_text(errors="replace")
            logs[int(path.name.split("-")[1])] = text
            shutil.copy2(path, kept / path.name)
            more += [f"{path.name}:", *(f"  {line}" for line in text.splitlines()[-40:])]
        if output.strip():
            more += ["tacc_agent exec printed:", *(f"  {x}" for x in output.splitlines()[-20:])]
    if code is None:
        return Line(FAIL, name, f"no end within {timeout:g} s (stopped); logs in {kept}", more)
    problems = ([f"exit {code}"] if code else []) + judge_logs(logs, gpus)
    if problems:
        return Line(FAIL, name, "; ".join(problems) + f"; logs in {kept}", more)
    detail = f"{gpus} rank(s), backend nccl on cuda, loss falls, {seconds:.0f} s; logs in {kept}"
    return Line(PASS, name, detail, more)


def accept_pair_check(gpus: int) -> list[Line]:
    name = CHECKS["accept"]
    if importlib.util.find_spec("torch") is None:
        return [Line(SKIP, name, f"torch is not importable by {sys.executable}")]
    cuda, about = torch_facts()
    backend = "nccl" if cuda and gpus >= 2 else "gloo"
    why = "" if backend == "nccl" else " (NCCL needs a GPU per rank: fewer than two here)"
    with socket.socket() as probe:  # a free port for rank 0's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = os.urandom(16).hex()
    ranks = []
    for rank in (0, 1):
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
            "SLURM_NTASKS": "2",
            "SLURMD_NODENAME": f"rank{rank}",
            "TACC_ACCEPT_TOKEN": token,
            **({"CUDA_VISIBLE_DEVICES": str(rank)} if backend == "nccl" else {}),
        }
        argv = [sys.executable, "-I", str(ACCEPT_PROBE), "torch", "--backend", backend]
        argv += ["--master-node", "rank0", "--master-address", "127.0.0.1", "--port", str(port)]
        ranks.append(
            subprocess.Popen(
                [*argv, *ACCEPT_WORDS],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for proc in ranks:
        try:
            stdout, stderr = proc.communicate(timeout=TRAIN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        outs.append(Output(proc.returncode, stdout, stderr))
    found = [json.loads(line) for line in outs[0].stdout.splitlines() if line.startswith("{")]
    figures = next((d for d in found if "busbw_gbytes" in d), None)
    more = [
        about,
        *(f"rank {r}: exit {o.rc} {o.stdout.strip()[-300:]}" for r, o in enumerate(outs)),
    ]
    if figures is None or any(o.rc != 0 for o in outs):
        tail = " | ".join(o.stderr.strip().splitlines()[-1] for o in outs if o.stderr.strip())
        return [Line(FAIL, name, f"{backend}: the pair did not finish: {tail[-300:]}", more)]
    detail = (
        f"{figures['backend']}{why}: bus bandwidth {figures['busbw_gbytes']} GB/s "
        f"({figures['bytes'] >> 20} MiB x {figures['iterations']})"
    )
    return [Line(PASS, name, detail, more)]


# ---------------------------------------------------------------- main
def guarded(name: str, check: Callable[[], list[Line]]) -> list[Line]:
    """A check that raises is that check's FAIL, never a traceback."""
    try:
        return check()
    except ImportError as exc:
        hint = (
            f": run `make gpu-check-bundle` where the venv is and carry {BUNDLE.relative_to(ROOT)}"
            if exc.name in PURE_PYTHON
            else ""
        )
        return [Line(FAIL, name, f"cannot import what it needs: {exc}{hint}")]
    except Exception as exc:
        return [Line(FAIL, name, f"check crashed: {type(exc).__name__}: {exc}")]


def bundle(target: Path = BUNDLE) -> int:
    """Copy the PURE_PYTHON packages, as this interpreter imports them, into target."""
    target.mkdir(parents=True, exist_ok=True)
    for module in PURE_PYTHON:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            print(f"gpu-check: {module} is not importable here: run it with the venv's python")
            return 1
        shutil.rmtree(target / module, ignore_errors=True)
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(source, target / module, ignore=shutil.ignore_patterns("__pycache__"))
        print(f"gpu-check: {module} from {source} -> {target / module}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bundle",
        action="store_true",
        help=f"copy {', '.join(PURE_PYTHON)} from this interpreter into {BUNDLE} and stop",
    )
    parser.add_argument(
        "--nvidia-smi", default="nvidia-smi", help="the real nvidia-smi (default: the one on PATH)"
    )
    parser.add_argument(
        "--only", action="append", choices=list(CHECKS), help="run only this check (repeatable)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bundle:
        return bundle()
    chosen = args.only or list(CHECKS)
    smi = shutil.which(args.nvidia_smi)
    if smi is None:
        for key in chosen:
            print(Line(SKIP, CHECKS[key], NO_SMI).text())
        print(f"gpu-check: nothing checked: {NO_SMI}")
        return 2
    out_dir = record_dir()
    listing = run([smi, "-L"])
    gpus = listed_gpus(listing.stdout)
    count = len(gpus)
    lines = [
        Line(
            PASS if listing.rc == 0 and gpus else FAIL,
            "nvidia-smi -L",
            f"{count} GPU(s) (exit {listing.rc}) {listing.stderr.strip()}".rstrip(),
            [f"GPU {g['index']}: {g['name']} ({g['uuid']})" for g in gpus],
        )
    ]
    print(lines[0].text(), flush=True)
    checks = {
        "agent": lambda: agent_gpu_check(smi, count),
        "facts": lambda: gpu_facts(smi, count),
        "compare": lambda: fake_vs_real(smi, gpus, out_dir),
        "torchrun": lambda: torchrun_check(count, out_dir),
        "accept": lambda: accept_pair_check(count),
    }
    for key in chosen:
        for line in guarded(CHECKS[key], checks[key]):
            print(line.text(), flush=True)
            lines.append(line)
    tally = {s: sum(line.status == s for line in lines) for s in (PASS, FAIL, SKIP)}
    print(
        f"gpu-check: {tally[PASS]} passed, {tally[FAIL]} failed, {tally[SKIP]} skipped; "
        f"records in {out_dir}"
    )
    return 1 if tally[FAIL] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("gpu-check: interrupted")
        sys.exit(130)
