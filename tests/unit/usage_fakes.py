"""Fakes for the usage reports' tests (test_usage*.py): sacct lines recorded the way
Slurm 22.05 prints them, and a sacct on PATH that prints them whatever it is asked (as a
cluster whose PrivateData shows everyone's jobs would) and writes down each call."""

from __future__ import annotations

import os
import pwd
import stat
import sys
from datetime import datetime
from pathlib import Path

ME = pwd.getpwuid(os.getuid()).pw_name
# Recorded the way Slurm 22.05 prints them: `sacct --noheader --parsable2 --allocations
# --duplicates --format=JobIDRaw,User,Account,Partition,State,Start,End,AllocCPUS,AllocTRES`
RECORDED = f"""\
101|{ME}|physics|gpu|COMPLETED|2025-10-31T22:00:00|2025-11-01T02:00:00|8|billing=8,cpu=8,gres/gpu=2,mem=32G,node=1
102|{ME}|physics|batch|CANCELLED by 0|2025-11-03T10:00:00|2025-11-03T10:30:00|2|billing=2,cpu=2,mem=4000M,node=1
103|{ME}|ml|gpu|RUNNING|2025-11-29T12:00:00|Unknown|4|billing=4,cpu=4,gres/gpu:a100=1,gres/gpu=1,mem=16G,node=1
104|{ME}|ml|gpu|PENDING|Unknown|Unknown|0|
105|{ME}|physics|gpu|REQUEUED|2025-11-10T00:00:00|2025-11-10T01:00:00|4|billing=4,cpu=4,gres/gpu=1,mem=8G,node=1
105|{ME}|physics|gpu|COMPLETED|2025-11-10T02:00:00|2025-11-10T03:00:00|4|billing=4,cpu=4,gres/gpu=1,mem=8G,node=1
106|{ME}|physics|gpu|COMPLETED|2025-11-12T00:00:00|2025-11-12T01:00:00|4|billing=4,cpu=4,gres/gpu:a100=2,mem=8G,node=1
107|{ME}|physics|batch|CANCELLED by 0|None|2025-11-13T00:00:00|0|
"""  # noqa: E501
OTHERS = """\
201|bob|physics|gpu|COMPLETED|2025-11-05T00:00:00|2025-11-05T10:00:00|64|cpu=64,gres/gpu=8,node=1
"""
NOW = datetime(2025, 12, 1, 0, 0, 0)


SACCT = """#!{python}
import json, os, sys
with open(os.environ["FAKE_SACCT_CALLS"], "a") as calls:
    calls.write(json.dumps({{"argv": sys.argv[1:],
                            "time_format": os.environ.get("SLURM_TIME_FORMAT")}}) + "\\n")
if os.environ.get("FAKE_SACCT_FAIL"):
    print(os.environ["FAKE_SACCT_FAIL"], file=sys.stderr)
    sys.exit(1)
sys.stdout.write(open(os.environ["FAKE_SACCT_OUT"]).read())
"""


def install_sacct(tmp_path: Path, monkeypatch) -> Path:
    """A sacct on PATH that prints FAKE_SACCT_OUT whatever it is asked (as a cluster whose
    PrivateData shows everyone's jobs would), and writes each call to FAKE_SACCT_CALLS
    (returned: it exists once sacct was called)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sacct"
    script.write_text(SACCT.format(python=os.path.realpath(sys.executable)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "sacct.out"
    out.write_text(RECORDED + OTHERS)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SACCT_OUT", str(out))
    monkeypatch.setenv("FAKE_SACCT_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")  # a user's own setting
    monkeypatch.setenv("TACC_AGENT_CONFIG", str(tmp_path / "no-config.yaml"))
    return tmp_path / "calls.jsonl"
