"""Record what Slurm really prints for every command shape this project reads (issue [20]).

The agent (packages/agent/tacc_agent/slurm/*.py and its callers), the slurm role's
sacctmgr modules and the rolling and acceptance roles parse the output of squeue, sacct,
scontrol, sinfo, sacctmgr and sshare. This tool runs each of those commands, with exactly
the argv (and SLURM_TIME_FORMAT) the reader uses, on a lab node, as the user the reader
runs as, and saves what came back under tests/unit/slurm_outputs/<major.minor>/, so that
unit tests can feed the readers real 22.05 (Debian 12) and 24.11 (Debian 13) output.

Run it as root (tacc-lab needs root) from the repository root with the repository's venv
(`make venv`: it builds the drain and reservation commands with the agent's own
tacc_agent.slurm functions), on a lab that `playbooks/site.yml` has converged:

    tacc-lab --name rec22 up --os bookworm
    ansible-playbook -i inventory/rec22/hosts.yml playbooks/site.yml
    .venv/bin/python tools/record_slurm_outputs.py --lab rec22
    tacc-lab --name rec22 down

(tests/unit/slurm_outputs/README.md has both labs' commands.) Steps:

1. `sinfo --version` on n1 names the directory (slurm-wlm 22.05.8 -> DIR/22.05/); the files
   this tool wrote there before are removed.
2. Setup (`--setup`, the default; `--no-setup` records the cluster as it is and finds the
   recorder's jobs by name): cancels what an earlier run left, then submits JOBS as
   alice and bob (running, pending for Resources/Priority/Dependency, held, BeginTime, an
   array with running and pending tasks, a --nodes=1-2 range, a heterogeneous job, ended
   COMPLETED/FAILED/CANCELLED/TIMEOUT, a suspended, a requeued and a requeue-held job,
   names with spaces and a line break), drains the last compute node with an agent-style
   reason and creates the acceptance gate's maintenance reservation on it. Every wait
   polls squeue up to `--wait` seconds; what has not shown by then is reported and
   recorded as it is.
3. Each row of RECORDINGS is run (`tacc-lab ssh NODE LINE`, every word quoted with
   shlex.join; `su - alice -c LINE` for alice) and saved as NAME.out (stdout, byte for
   byte), NAME.err (stderr, only when there is some) and NAME.rc (the exit status, only
   when it is not 0). MANIFEST.json lists the Slurm and Debian versions, the date, the
   files, each recording's filled-in argv, the job ids by role and what was skipped.
4. Cleanup (`--cleanup`, the default): cancels the recorder's jobs, resumes the node it
   drained (only while the node still has the recorder's reason) and deletes the
   reservation.

What a plain CPU-only lab cannot show (GPUs, more partitions, accounts and QoS, a
controller or slurmdbd down) is listed in NOT_RECORDED, and in the manifest.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from tacc_agent.slurm import nodes, reservations

TACC_LAB = "tacc-lab"
HEAD = "n1"  # controller, slurmdbd (and login in small labs): where commands run
ROOT = "root"
ALICE = "alice"
BOB = "bob"
OWNER = "owner"  # an action the job's owner takes (scancel)
COMMAND_TIMEOUT = 60  # seconds for one command on the lab (ssh included)
POLL_SECONDS = 3
WAIT_SECONDS = 240
REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPOSITORY / "tests" / "unit" / "slurm_outputs"
SUFFIXES = (".out", ".err", ".rc")
MANIFEST = "MANIFEST.json"

# --- the recorder's jobs and the node it takes out of service ----------------------------

PREFIX = "tacc-rec-"  # every job's name starts so: the recorder finds its jobs by name
TAG = "5eedf00d5eedf00d"  # the random part of the agent's tag (tacc:<job dir>:<16 hex>)
SCRIPT_DIR = "/tmp/tacc-record-slurm"  # noqa: S108 - a directory on the lab's n1
WORK_DIR = "/tmp"  # noqa: S108 - the jobs' --chdir on the lab's nodes
TIME_LIMIT = "30"  # minutes: no job outlives a forgotten cleanup by long
SCRIPTS = {
    "sleep": "#!/bin/sh\nsleep 1200\n",
    "true": "#!/bin/sh\ntrue\n",
    "fail": "#!/bin/sh\nexit 3\n",
}
# A reason as the agent's health cycle writes it (health/cycle.py: "tacc: <check>: ...").
DRAIN_REASON = "tacc: gpu: 3 GPU(s), expected 4"
RESERVATION_MINUTES = 120
PARTITION = "batch"  # the slurm role's default partition (roles/slurm/defaults/main.yml)
UNKNOWN_JOB = "67000000"  # below MaxJobId, never reached by a lab: "Invalid job id"
UNKNOWN_NODE = "nosuch"
UNKNOWN_RESERVATION = "tacc-accept-nosuch"
HOSTLIST = "n[2-4,7]"
DETAILS_START = "0123456789abcdef"  # queue.queue_details draws 16 hex digits afresh each time
JOB_ID = re.compile(r"\d+")  # the job of "12", "12_3", "12_[2-5]", "12+1"
# `sinfo --version`: "slurm-wlm 22.05.8" from Debian's packages, "slurm 24.11.5" upstream.
VERSION = re.compile(r"^slurm[-\w]* (\d+)\.(\d+)\.")


class Job(NamedTuple):
    """One job the setup submits; `options` may name {placeholders} (facts, job ids)."""

    role: str  # its name is PREFIX + role (unless `name`); the key of its id
    user: str
    options: tuple[str, ...]  # sbatch long options after the common ones
    start: tuple[str, ...]  # what squeue shows before its action (below) is taken
    then: str  # a key of ACTIONS, or ""
    shows: tuple[str, ...]  # what squeue shows once the cluster is set up
    script: str = "sleep"  # a key of SCRIPTS
    name: str = ""
    comment: str = ""


# Shown tokens: "STATE" (squeue %T), "STATE:Reason" (%r), "STATE:*" (any reason but None).
RUNNING = ("RUNNING",)
WAITING = ("PENDING:*",)
HELD = ("PENDING:JobHeldUser",)
PIN = "--nodelist={node}"
NAME_WITH_SPACES = PREFIX + "name lr=0.1 two words"
COMMENT_WITH_BARS = f"tacc:name:{TAG}|a comment|with bars"
# Submitted first, before the node is drained. Those with a `start` are waited for: their
# actions need them running, and they keep the first compute node busy.
EARLY = (
    Job("cancelled", ALICE, (), RUNNING, "cancel", ("CANCELLED",)),
    Job("suspended", BOB, (), RUNNING, "suspend", ("SUSPENDED",)),
    Job("requeued", ALICE, ("--requeue",), RUNNING, "requeue", ()),
    Job("requeuehold", ALICE, ("--requeue",), RUNNING, "requeuehold", ()),
    Job("running", ALICE, (PIN, "--nodes=1", "--ntasks-per-node=1"), RUNNING, "", RUNNING),
    Job("bob", BOB, (PIN,), RUNNING, "", RUNNING),
    Job("multi", ALICE, ("--nodes=2", "--ntasks=3", "--mem=100M"), RUNNING, "", RUNNING),
    Job("array", ALICE, ("--array=0-5%2",), (), "", ("RUNNING", "PENDING:*")),
    Job("het", ALICE, ("--ntasks=1", ":", "--ntasks=1"), (), "", RUNNING),
    Job("name", ALICE, (), (), "", RUNNING, name=NAME_WITH_SPACES, comment=COMMENT_WITH_BARS),
    Job("completed", ALICE, (), (), "", ("COMPLETED",), script="true"),
    Job("failed", ALICE, (), (), "", ("FAILED",), script="fail"),
    Job("timeout", ALICE, ("--time=1",), (), "", ("TIMEOUT",)),
)
# Submitted after the drain and the reservation: pending behind the running jobs.
LATE = (
    Job("resources", ALICE, (PIN, "--exclusive"), (), "", WAITING),
    Job("priority", BOB, (PIN, "--exclusive"), (), "", WAITING),
    Job("range", ALICE, ("--nodes=1-2", "--exclusive"), (), "", WAITING),
    Job("dependency", ALICE, ("--dependency=afterok:{running}",), (), "", ("PENDING:Dependency",)),
    Job("held", ALICE, ("--hold",), (), "nice", HELD),
    Job("begin", ALICE, ("--begin=now+1hour",), (), "", ("PENDING:BeginTime",)),
    Job("newline", ALICE, ("--hold",), (), "", HELD, name=PREFIX + "newline\nsecond line"),
    Job("cancelled_pending", ALICE, ("--hold",), (), "cancel", ("CANCELLED",)),
)
JOBS = EARLY + LATE
# What is done to a job once it has started (or been submitted, for a late one).
ACTIONS: dict[str, tuple[str, list[str]]] = {
    "cancel": (OWNER, ["scancel", "{id}"]),
    "suspend": (ROOT, ["scontrol", "suspend", "{id}"]),
    "requeue": (ROOT, ["scontrol", "requeue", "{id}"]),
    "requeuehold": (ROOT, ["scontrol", "requeuehold", "{id}"]),
    "nice": (ROOT, ["scontrol", "update", "JobId={id}", "Nice=-5"]),
}

# --- the recordings ------------------------------------------------------------------------

NO_ENV: Mapping[str, str] = {}
EPOCH = {"SLURM_TIME_FORMAT": "%s"}  # slurm/run.py EPOCH_TIMES
STANDARD = {"SLURM_TIME_FORMAT": "standard"}  # slurm/accounting.py SACCT_ENV
# The argv pieces as the readers build them (copied, not imported: the agent is not
# installed where this runs).
SHOW_JOB = ["scontrol", "show", "job", "--oneliner"]  # slurm/oneliner.py show_lines
SHOW_NODE = ["scontrol", "show", "node", "--oneliner"]
SHOW_RESERVATION = ["scontrol", "show", "reservation"]
QUEUED = ["squeue", "--noheader", "--array", "--states=PENDING,RUNNING"]  # slurm/queue.py
QUEUE_FORMAT = (  # slurm/queue.py QUEUE_FORMAT, as format_option builds it
    "--Format=JobArrayID:0|,UserName:0|,State:0|,Nice:0|,NumNodes:0|,NumTasks:0|,"
    "tres-alloc:0|,tres-per-job:0|,tres-per-node:0|,tres-per-task:0|,TimeUsed:0|,"
    "Partition:0|,Reason:0|"
)
RUNNING_JOBS = ["squeue", "--noheader", "--all", "--array", "--states=RUNNING,SUSPENDED"]
RUNNING_FORMAT = "--Format=JobArrayID:0|,UserName:0|,Account:0|,QOS:0|,Partition:0|,tres-alloc:0|"
OWN = ["squeue", "--me", "--noheader", "--array"]  # slurm/queue.py own_jobs
OWN_FORMAT = "--format=%i|%T|%r|%M|%N|%Z|%k"
DETAILS = f"{DETAILS_START} %i %u %l %N %V %S %f %j"  # slurm/queue.py queue_details
PENDING_REASONS = [
    "squeue",
    "--noheader",
    "--partition={partition}",
    "--states=PENDING",
    "--format=%i|%r",
]  # slurm/queue.py pending_reasons
HOLDING = "--states=CONFIGURING,RUNNING,COMPLETING,SUSPENDED,STOPPED"  # checks/tmpfiles.py
IDLE = ["sinfo", "--noheader", "--partition={partition}", "--states=idle", "--format=%D|%T"]
SACCT = ["sacct", "--noheader", "--parsable2"]  # slurm/accounting.py SACCT
ALLOCATIONS = [*SACCT, "--allocations", "--duplicates"]  # accounting.allocations_argv
WINDOW = ["--starttime={since}", "--endtime={until}"]
ALLOCATION_FORMAT = "--format=JobIDRaw,User,Account,Partition,State,Start,End,AllocCPUS,AllocTRES"
JOB_NODES = [*SACCT, "--allocations", "--format=JobID,NodeList", "--user={uid}"]
ENDED = "--jobs={completed},{failed},{cancelled_pending},{requeued}"
JOB_PLACES = [*SACCT, "--allocations", "--user={uid}", "--starttime={since}"]
SACCTMGR = ["sacctmgr", "--noheader", "--parsable2", "show"]  # accounting.py, tacc_sacctmgr
QUOTA_ASSOC = "format=Account,Fairshare,QOS,DefaultQOS,MaxTRES,MaxJobs,MaxWall"  # quota.ASSOC
QUOTA_QOS = "format=Name,Priority,MaxWall,MaxTRESPU,MaxJobsPU,Preempt,PreemptMode,UsageFactor"
SHARES = ["sshare", "--noheader", "--parsable2", "--users", "alice"]  # accounting.shares
QUOTA_SHARE = "--format=Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare"
LIMITS_QOS = "format=Name,MaxTRES,MaxTRESPU,MaxTRESPA,GrpTRES"  # node_limits.qos_limits
LIMITS_ASSOC = "format=Account,ParentName,User,MaxTRES,GrpTRES"  # node_limits.ASSOC_COLUMNS
ROLE_QOS = "format=Name,Priority,Preempt,MaxWall,MaxTRESPU,MaxJobsPU,PreemptMode,UsageFactor"
ROLE_ASSOC = "format=Account,User,Partition,Fairshare,DefaultQOS,QOS"  # slurm_accounts.FORMAT


class Recording(NamedTuple):
    """One command to record: NAME.out/.err/.rc; argv and node may name {placeholders}."""

    name: str
    user: str  # root or alice
    env: Mapping[str, str]
    argv: list[str]
    node: str = HEAD


def job_rows(role: str, users: Iterable[str], env: Mapping[str, str] = NO_ENV) -> list[Recording]:
    """`scontrol show job --oneliner ID` of one of the recorder's jobs, as each user."""
    suffix = ".epoch" if env else ""
    name = f"scontrol-show-job-{role}{suffix}"
    return [Recording(f"{name}.{user}", user, env, [*SHOW_JOB, f"{{{role}}}"]) for user in users]


# Rows 1-38 of issue [20]'s list of command shapes (the `# N:` numbers), less what needs
# GPUs or another lab (NOT_RECORDED). Each row names the reader(s) it feeds.
RECORDINGS: list[Recording] = [
    # 1: jobs.job_records -> preempt.record_of, queue_ticks.read_records (the queue tick)
    Recording("scontrol-show-job.root", ROOT, NO_ENV, SHOW_JOB),
    # 2: jobs.job_record (verbs.slurm_info, as the user), jobs.job_alone (preempt, as root):
    # verbs' state words, job_tags.owned_by_caller (UserId), jobs.node_counts (NumNodes
    # 1-2), jobs.tres_of (TRES= or ReqTRES=/AllocTRES=), oneliner.job_record_of (names
    # with spaces and a line break), an array and a heterogeneous job (several lines)
    *job_rows("running", (ROOT, ALICE)),
    *job_rows("resources", (ROOT, ALICE)),
    *job_rows("range", (ROOT,)),
    *job_rows("held", (ALICE,)),
    *job_rows("array", (ROOT, ALICE)),
    *job_rows("het", (ROOT,)),
    *job_rows("name", (ROOT,)),
    *job_rows("newline", (ROOT,)),
    *job_rows("completed", (ALICE,)),
    *job_rows("failed", (ALICE,)),
    *job_rows("cancelled", (ALICE,)),
    *job_rows("cancelled_pending", (ALICE,)),
    *job_rows("timeout", (ALICE,)),
    *job_rows("suspended", (ROOT,)),
    *job_rows("requeuehold", (ROOT,)),
    # 2: verbs.slurm_info as alice on bob's job (PrivateData=jobs), and on a job Slurm
    # does not know (oneliner.show_lines: "Invalid job id")
    Recording("scontrol-show-job-other-user.alice", ALICE, NO_ENV, [*SHOW_JOB, "{bob}"]),
    Recording("scontrol-show-job-unknown.alice", ALICE, NO_ENV, [*SHOW_JOB, UNKNOWN_JOB]),
    # 3: early_start.fresh_delay (jobs.job_alone with EPOCH_TIMES: SubmitTime, EligibleTime)
    *job_rows("begin", (ROOT,), EPOCH),
    *job_rows("requeued", (ROOT,), EPOCH),
    *job_rows("running", (ROOT,), EPOCH),
    # 4: jobs.detailed_line/node_groups (health/job_usage.py, root on the compute node)
    Recording(
        "scontrol-show-job-detail-multi.root",
        ROOT,
        NO_ENV,
        ["scontrol", "show", "job", "-d", "-o", "{multi}"],
        "{node}",
    ),
    Recording(
        "scontrol-show-job-detail-running.root",
        ROOT,
        NO_ENV,
        ["scontrol", "show", "job", "-d", "-o", "{running}"],
        "{node}",
    ),
    # 5: nodes.all_nodes/node -> node_of (health/cycle.py, health/acceptance.py,
    # execute/lost_nodes.py, execute/launch.py features, schedule/cluster_shape.py)
    Recording("scontrol-show-node.root", ROOT, NO_ENV, SHOW_NODE),
    Recording("scontrol-show-node.alice", ALICE, NO_ENV, SHOW_NODE),
    Recording("scontrol-show-node-busy.root", ROOT, NO_ENV, [*SHOW_NODE, "{node}"]),
    Recording("scontrol-show-node-drained.root", ROOT, NO_ENV, [*SHOW_NODE, "{drained}"]),
    Recording("scontrol-show-node-unknown.root", ROOT, NO_ENV, [*SHOW_NODE, UNKNOWN_NODE]),
    # 6: nodes.all_partitions -> partition_of (submit.cluster_shape, node_limits)
    Recording(
        "scontrol-show-partition.root",
        ROOT,
        NO_ENV,
        ["scontrol", "show", "partition", "--oneliner"],
    ),
    # 7: nodes.hostnames (execute/launch.step_hostnames)
    Recording(
        "scontrol-show-hostnames.alice", ALICE, NO_ENV, ["scontrol", "show", "hostnames", HOSTLIST]
    ),
    # 8: reservations.exists (health/acceptance.py); the name comes before --oneliner
    Recording(
        "scontrol-show-reservation.root",
        ROOT,
        NO_ENV,
        [*SHOW_RESERVATION, "{reservation}", "--oneliner"],
    ),
    Recording(
        "scontrol-show-reservation-unknown.root",
        ROOT,
        NO_ENV,
        [*SHOW_RESERVATION, UNKNOWN_RESERVATION, "--oneliner"],
    ),
    # 9: roles/acceptance "Look for an acceptance reservation a killed run left" (rc only)
    Recording(
        "scontrol-show-reservation-multiline.root",
        ROOT,
        NO_ENV,
        [*SHOW_RESERVATION, "{reservation}"],
    ),
    Recording(
        "scontrol-show-reservation-multiline-unknown.root",
        ROOT,
        NO_ENV,
        [*SHOW_RESERVATION, UNKNOWN_RESERVATION],
    ),
    # 10: controller.parse_config (health/slurm_cluster.accounting_storage,
    # node_limits.enforced, ClusterName)
    Recording("scontrol-show-config.root", ROOT, NO_ENV, ["scontrol", "show", "config"]),
    # 11: controller.slurmctld_up (health/slurm_cluster.read_slurmctld)
    Recording("scontrol-ping.root", ROOT, NO_ENV, ["scontrol", "ping"]),
    # 12: nodes.parse_sinfo_json + health/slurm_cluster.node_samples
    Recording("sinfo-json.root", ROOT, NO_ENV, ["sinfo", "--json"]),
    # 13: nodes.parse_idle (submit.partition_load)
    Recording("sinfo-idle.alice", ALICE, NO_ENV, IDLE),
    # 14: roles/acceptance "Read why the node is drained" (regex on %100E)
    Recording(
        "sinfo-reason-drained.root",
        ROOT,
        NO_ENV,
        ["sinfo", "--noheader", "--nodes", "{drained}", "--format=%100E"],
    ),
    Recording(
        "sinfo-reason-busy.root",
        ROOT,
        NO_ENV,
        ["sinfo", "--noheader", "--nodes", "{node}", "--format=%100E"],
    ),
    # 15: queue.parse_queue (queue_ticks.read_queue as root; quota.in_queue as the user)
    Recording("squeue-queue.root", ROOT, NO_ENV, [*QUEUED, QUEUE_FORMAT]),
    Recording("squeue-queue-user.alice", ALICE, NO_ENV, [*QUEUED, "--user=alice", QUEUE_FORMAT]),
    # 16: queue.parse_details (queue_ticks.read_details), start word DETAILS_START
    Recording("squeue-details.root", ROOT, EPOCH, [*QUEUED, "-o", DETAILS]),
    # 17: queue.parse_running (preempt.limit_refusal -> node_limits; strict)
    Recording("squeue-running.root", ROOT, NO_ENV, [*RUNNING_JOBS, RUNNING_FORMAT]),
    # 18: queue.parse_own (verbs.ps, verbs.array_queue -> job_tags.tagged_for)
    Recording("squeue-own.alice", ALICE, NO_ENV, [*OWN, OWN_FORMAT]),
    Recording("squeue-own-array.alice", ALICE, NO_ENV, [*OWN, "--jobs={array}", OWN_FORMAT]),
    # 19: queue.parse_tags (found_again.queued_tags)
    Recording(
        "squeue-tags.alice", ALICE, NO_ENV, ["squeue", "--me", "--noheader", "--format=%F|%k"]
    ),
    # 20: queue.parse_reasons (submit.partition_load -> waiting_jobs); as alice the agent
    # sees her own jobs only (PrivateData=jobs), as root everybody's
    Recording("squeue-reasons.alice", ALICE, NO_ENV, PENDING_REASONS),
    Recording("squeue-reasons.root", ROOT, NO_ENV, PENDING_REASONS),
    # 21: queue.parse_partition_states (health/slurm_cluster.read_jobs; strict)
    Recording(
        "squeue-partition-states.root",
        ROOT,
        NO_ENV,
        ["squeue", "-h", "-a", "-r", "-t", "PENDING,RUNNING", "-o", "%P %T"],
    ),
    # 22: queue.parse_uids (health/checks/tmpfiles.job_uids, root on the compute node)
    Recording(
        "squeue-uids.root",
        ROOT,
        NO_ENV,
        ["squeue", "--noheader", "--nodelist={node}", HOLDING, "--format=%U"],
        "{node}",
    ),
    # 23: roles/rolling "List the node's jobs" and "Wait until no job is left on the node"
    Recording(
        "squeue-rolling-running.root",
        ROOT,
        NO_ENV,
        ["squeue", "--noheader", "--nodelist", "{node}", "--states=RUNNING", "--format=%A"],
    ),
    Recording(
        "squeue-rolling-left.root",
        ROOT,
        NO_ENV,
        ["squeue", "--noheader", "--nodelist", "{node}", "--format=%A"],
    ),
    Recording(
        "squeue-rolling-left-drained.root",
        ROOT,
        NO_ENV,
        ["squeue", "--noheader", "--nodelist", "{drained}", "--format=%A"],
    ),
    # 24: accounting.allocations -> parse_allocation (accounting/usage.py as the user,
    # --user=UID; usage_report.py as root, --allusers), SLURM_TIME_FORMAT=standard
    Recording(
        "sacct-allocations.alice",
        ALICE,
        STANDARD,
        [*ALLOCATIONS, "--user={uid}", *WINDOW, ALLOCATION_FORMAT],
    ),
    Recording(
        "sacct-allocations.root",
        ROOT,
        STANDARD,
        [*ALLOCATIONS, "--allusers", *WINDOW, ALLOCATION_FORMAT],
    ),
    # 25: accounting.submitted_nodes -> parse_submitted_nodes (preempt.recorded_range); the
    # recorder submits in the agent's layout (long options, the script last)
    Recording(
        "sacct-submit-line-range.root",
        ROOT,
        NO_ENV,
        [*SACCT, "--allocations", "--jobs={range}", "--format=JobID,SubmitLine"],
    ),
    Recording(
        "sacct-submit-line-completed.root",
        ROOT,
        NO_ENV,
        [*SACCT, "--allocations", "--jobs={completed}", "--format=JobID,SubmitLine"],
    ),
    # 26: accounting.own_job_nodes -> parse_job_nodes (verbs.ran_on, for ps)
    Recording("sacct-job-nodes.alice", ALICE, NO_ENV, [*JOB_NODES, ENDED]),
    # 27: accounting.own_jobs_since -> parse_job_places (found_again.accounted_job; no env)
    Recording(
        "sacct-job-places.alice",
        ALICE,
        NO_ENV,
        [*JOB_PLACES, "--format=JobID,WorkDir,Comment"],
    ),
    # 29-31: tasks/accounting/quota.py (as the user; PrivateData applies)
    Recording(
        "sacctmgr-assoc-user.alice",
        ALICE,
        NO_ENV,
        [*SACCTMGR, "assoc", "where", "user=alice", QUOTA_ASSOC],
    ),
    Recording("sacctmgr-qos-quota.alice", ALICE, NO_ENV, [*SACCTMGR, "qos", QUOTA_QOS]),
    Recording("sshare-user.alice", ALICE, NO_ENV, [*SHARES, QUOTA_SHARE]),
    # 32: node_limits.qos_limits (root; the jobs' QOS is normal, the only one in the lab)
    Recording(
        "sacctmgr-qos-limits.root",
        ROOT,
        NO_ENV,
        [*SACCTMGR, "qos", "where", "name=normal", LIMITS_QOS],
    ),
    # 33: node_limits.association_limits (root)
    Recording(
        "sacctmgr-assoc-tree.root",
        ROOT,
        NO_ENV,
        [*SACCTMGR, "assoc", "where", "cluster={cluster}", LIMITS_ASSOC],
    ),
    # 34: health/slurm_cluster.SlurmdbdReader (rc only); slurm_accounts.parse_clusters
    Recording(
        "sacctmgr-cluster-health.root",
        ROOT,
        NO_ENV,
        ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
    ),
    Recording("sacctmgr-cluster.root", ROOT, NO_ENV, [*SACCTMGR, "cluster", "format=Cluster"]),
    # 35: roles/slurm/library/slurm_qos.parse_table
    Recording("sacctmgr-qos-role.root", ROOT, NO_ENV, [*SACCTMGR, "qos", ROLE_QOS]),
    # 36: roles/slurm/library/slurm_qos.parse_tres (gpu_tres_known)
    Recording("sacctmgr-tres.root", ROOT, NO_ENV, [*SACCTMGR, "tres", "format=Type,Name"]),
    # 37: roles/slurm/library/slurm_accounts.parse_assocs
    Recording(
        "sacctmgr-assoc-role.root",
        ROOT,
        NO_ENV,
        [*SACCTMGR, "assoc", "where", "cluster={cluster}", ROLE_ASSOC],
    ),
    # 38: roles/rolling regexes (State=, Reason=...$, SlurmdStartTime=), bench/operations.py;
    # --oneline is getopt's prefix of --oneliner, spelled as the role spells it
    Recording(
        "scontrol-show-node-oneline-drained.root",
        ROOT,
        NO_ENV,
        ["scontrol", "show", "node", "{drained}", "--oneline"],
    ),
    Recording(
        "scontrol-show-node-oneline-busy.root",
        ROOT,
        NO_ENV,
        ["scontrol", "show", "node", "{node}", "--oneline"],
    ),
]

# Rows (of the same list) that a plain CPU-only lab after site.yml cannot show:
# "TODO GPU" needs `tacc-lab fake-hw NODE --gpus N --gpu-model M` and site.yml again
# (tests/integration/test_hardware_roles.py does it); "TODO inventory" needs lab variables
# the lab's inventory does not set; "TODO fault" stops or reboots a daemon or node.
NOT_RECORDED = (
    (
        "1, 2, 15",
        "TODO GPU: jobs asking --gpus=4, --gres=gpu:2, --gres=gpu:a100:2, "
        "--gpus-per-task=1; a running multi-node job with GRES (the tres-per-* spelling)",
    ),
    (
        "4",
        "TODO GPU: -d node groups with GRES=gpu(IDX:..), shards (--gres=shard:2), and a "
        "multi-node GPU job with identical groups (Nodes=n[2-3])",
    ),
    (
        "5, 38",
        "TODO GPU: typed GPUs and shards in Gres= (gpu:h100:4(S:0-1),shard:16) and "
        "the GPU type in AvailableFeatures=",
    ),
    ("12", "TODO GPU: sinfo --json with gres and gres_used (a GPU job running)"),
    ("16", "TODO GPU: a constraint such as a100|h100 in %f (node features)"),
    ("24", "TODO GPU: AllocTRES with a typed gres/gpu:a100= beside gres/gpu="),
    ("36", "TODO GPU: AccountingStorageTRES with gres/gpu and gres/<type>"),
    (
        "1, 6, 12, 21",
        "TODO inventory: a second partition (a pending -p batch,gpu job; a "
        "partition's own QoS= and MaxNodes=): the lab has one partition, batch",
    ),
    (
        "30, 32, 35",
        "TODO inventory: QoS with limits (MaxTRESPU gres/gpu=8, MaxJobsPU, "
        "MaxWall, Preempt, PreemptMode, UsageFactor): the lab sets no slurm_qos, only "
        "Slurm's normal exists",
    ),
    (
        "29, 31, 33, 37",
        "TODO inventory: two accounts in a dept -> lab tree, a "
        "per-partition association, Fairshare=parent, GrpTRES/MaxTRES: the lab has one "
        "account, research",
    ),
    ("23", "TODO inventory: an empty compute node (a third one: tacc-lab up --nodes 4)"),
    (
        "5",
        "with two compute nodes the drained node carries the multi-node job: it records "
        "as MIXED+DRAIN (draining), not IDLE+DRAIN; +PLANNED shows only when backfill plans "
        "an idle node",
    ),
    (
        "14",
        "reasons tacc: acceptance pending|failed and tacc: rolling (site.yml's "
        "acceptance play has passed the nodes before the recorder runs)",
    ),
    ("5", "TODO fault: DOWN+NOT_RESPONDING (slurmd stopped on a node)"),
    ("10, 28, 34", "TODO fault: no accounting, or slurmdbd stopped (the error texts)"),
    ("11", "TODO fault: scontrol ping with slurmctld stopped; a backup controller"),
    (
        "38",
        "TODO fault: a node right after a reboot (playbooks/rolling.yml): "
        "NOT_RESPONDING, then a new SlurmdStartTime",
    ),
)


# --- running commands on the lab -----------------------------------------------------------


class LabFailure(Exception):
    """The lab did not answer as it should (tacc-lab or ssh failed, a setup step failed)."""


class NoAnswer(LabFailure):
    """A command on the lab did not end within its timeout."""


class Done(NamedTuple):
    code: int
    stdout: bytes
    stderr: bytes


def command_line(argv: list[str], user: str, env: Mapping[str, str]) -> str:
    """The shell line that runs argv as `user` with env added (env(1), as the agent adds
    its env to its own environment); su - starts the user's login environment."""
    words = ["env", *(f"{key}={value}" for key, value in env.items())] if env else []
    line = shlex.join([*words, *argv])
    return line if user == ROOT else shlex.join(["su", "-", user, "-c", line])


class Lab:
    """A running tacc-lab lab, reached with `tacc-lab --name NAME ssh NODE LINE`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(
        self,
        argv: list[str],
        user: str = ROOT,
        env: Mapping[str, str] = NO_ENV,
        node: str = HEAD,
    ) -> Done:
        """argv's exit status and output, whatever the status; LabFailure when tacc-lab or
        ssh failed, NoAnswer when it did not end within COMMAND_TIMEOUT."""
        line = command_line(argv, user, env)
        ssh = [TACC_LAB, "--name", self.name, "ssh", node, line]
        try:
            proc = subprocess.run(
                ssh,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        except FileNotFoundError:
            raise LabFailure(f"{TACC_LAB} not found on PATH (make venv installs it)") from None
        except subprocess.TimeoutExpired:
            raise NoAnswer(f"no answer within {COMMAND_TIMEOUT} s: {line}") from None
        if proc.stderr.startswith(b"tacc-lab: error:") or proc.returncode == 255:
            said = proc.stderr.decode(errors="replace").strip()
            raise LabFailure(f"{node}: {line}: {said or 'ssh failed'}")
        return Done(proc.returncode, proc.stdout, proc.stderr)

    def text(self, argv: list[str], user: str = ROOT, node: str = HEAD) -> str:
        """argv's stdout; LabFailure when it exits non-zero."""
        done = self.run(argv, user, node=node)
        if done.code != 0:
            said = done.stderr.decode(errors="replace").strip()
            raise LabFailure(f"{node}: {shlex.join(argv)} exited {done.code}: {said}")
        return done.stdout.decode(errors="replace")


def warn(message: str) -> None:
    print(f"record_slurm_outputs: {message}", file=sys.stderr)


# --- what the lab is --------------------------------------------------------------------------


def version_dir(version: str) -> str:
    """major.minor of `sinfo --version` ("slurm-wlm 22.05.8" -> "22.05")."""
    found = VERSION.search(version)
    if found is None:
        raise LabFailure(f"sinfo --version said {version!r}, not a Slurm version")
    return f"{found[1]}.{found[2]}"


def node_order(name: str) -> tuple[str, int]:
    found = re.fullmatch(r"(\D*)(\d+)", name)
    return (found[1], int(found[2])) if found else (name, 0)


def compute_nodes(lab: Lab) -> list[str]:
    out = lab.text(["sinfo", "--noheader", "--Node", "--format=%N"])
    return sorted(set(out.split()), key=node_order)


def cluster_name(lab: Lab) -> str:
    found = re.search(r"^ClusterName\s*=\s*(\S+)", lab.text(["scontrol", "show", "config"]), re.M)
    if found is None:
        raise LabFailure("scontrol show config: no ClusterName")
    return found[1]


def node_time(lab: Lab, when: str) -> str:
    """A moment as sacct takes it (the node's clock and zone): `date -d WHEN`."""
    return lab.text(["date", "-d", when, "+%Y-%m-%dT%H:%M:%S"]).strip()


def lab_facts(lab: Lab) -> dict[str, str]:
    """The {placeholders} the recordings name, other than the job ids."""
    computes = compute_nodes(lab)
    if len(computes) < 2:
        raise LabFailure(f"compute nodes {computes}: the recorder needs two (tacc-lab up)")
    return {
        "node": computes[0],  # busy with jobs of alice and bob
        "drained": computes[-1],  # drained by the recorder, in its maintenance reservation
        "reservation": f"tacc-accept-{computes[-1]}",  # health/acceptance.py's name
        "partition": PARTITION,
        "cluster": cluster_name(lab),
        "uid": lab.text(["id", "-u", ALICE]).strip(),
        "since": node_time(lab, "1 day ago"),
        "until": node_time(lab, "1 hour"),
    }


# --- the recorder's jobs --------------------------------------------------------------------


def job_base(word: str) -> str:
    """The job of an id as squeue or sacct print it: 12, 12_3, 12_[2-5], 12+1 -> 12."""
    found = JOB_ID.match(word.strip())
    return found.group() if found else ""


def newest_by_role(lines: Iterable[str]) -> dict[str, str]:
    """{role: newest job id} of "ID|NAME" lines whose name starts with PREFIX."""
    found: dict[str, int] = {}
    for line in lines:
        job, _, name = line.partition("|")
        words = name.split()
        base = job_base(job)
        if base and words and words[0].startswith(PREFIX):
            role = words[0].removeprefix(PREFIX)
            found[role] = max(found.get(role, 0), int(base))
    return {role: str(number) for role, number in found.items()}


def queued_recorder_jobs(lab: Lab) -> list[str]:
    """The recorder's jobs still in the queue (any user's)."""
    out = lab.text(["squeue", "--noheader", "--all", "--format=%i|%j"])
    found = set()
    for line in out.splitlines():
        job, _, name = line.partition("|")
        if name.startswith(PREFIX) and job_base(job):
            found.add(job_base(job))
    return sorted(found, key=int)


def find_jobs(lab: Lab, since: str) -> dict[str, str]:
    """The newest job of each role, from the controller (it keeps ended jobs for
    MinJobAge) and from accounting (older ended jobs)."""
    squeue = ["squeue", "--noheader", "--all", "--states=all", "--format=%i|%j"]
    lines = lab.text(squeue).splitlines()
    sacct = [*SACCT, "--allocations", "--allusers", f"--starttime={since}"]
    done = lab.run([*sacct, "--format=JobID,JobName"])
    if done.code == 0:
        lines += done.stdout.decode(errors="replace").splitlines()
    return newest_by_role(lines)


def sbatch_argv(job: Job, facts: Mapping[str, str]) -> list[str]:
    """sbatch in the agent's layout: --parsable, long options only, the script last;
    KeyError when an option names a job that was not submitted."""
    common = [
        f"--job-name={job.name or PREFIX + job.role}",
        f"--comment={job.comment or f'tacc:{job.role}:{TAG}'}",
        f"--chdir={WORK_DIR}",
        "--output=/dev/null",
        f"--time={TIME_LIMIT}",
    ]
    options = [word.format_map(facts) for word in job.options]
    return ["sbatch", "--parsable", *common, *options, f"{SCRIPT_DIR}/{job.script}.sh"]


def submit(lab: Lab, job: Job, facts: Mapping[str, str]) -> str:
    """The new job's id; "" (and a warning) when it could not be submitted."""
    try:
        argv = sbatch_argv(job, facts)
    except KeyError as missing:
        warn(f"{job.role}: not submitted, no job {missing} to name")
        return ""
    done = lab.run(argv, job.user)
    job_id = done.stdout.decode(errors="replace").strip().split(";")[0]
    if done.code != 0 or not JOB_ID.fullmatch(job_id):
        warn(f"{job.role}: sbatch said {done.stderr.decode(errors='replace').strip()!r}")
        return ""
    return job_id


def submit_all(lab: Lab, jobs: Iterable[Job], facts: Mapping[str, str]) -> dict[str, str]:
    ids: dict[str, str] = {}
    for job in jobs:
        job_id = submit(lab, job, {**facts, **ids})
        if job_id:
            ids[job.role] = job_id
    return ids


def act(lab: Lab, job: Job, job_id: str) -> None:
    """The job's action (ACTIONS), by its owner or root; a warning when refused."""
    who, words = ACTIONS[job.then]
    argv = [word.format(id=job_id) for word in words]
    done = lab.run(argv, job.user if who == OWNER else ROOT)
    if done.code != 0:
        warn(f"{job.role}: {shlex.join(argv)}: {done.stderr.decode(errors='replace').strip()}")


def act_on(lab: Lab, jobs: Iterable[Job], ids: Mapping[str, str]) -> None:
    for job in jobs:
        if job.then and job.role in ids:
            act(lab, job, ids[job.role])


# --- waiting until squeue shows the states -------------------------------------------------


def queue_states(lab: Lab) -> dict[str, list[tuple[str, str]]]:
    """{job: [(state, reason) of each of its lines]} of every job the controller knows."""
    out = lab.text(["squeue", "--noheader", "--all", "--states=all", "--format=%i|%T|%r"])
    found: dict[str, list[tuple[str, str]]] = {}
    for line in out.splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) == 3 and job_base(fields[0]):
            found.setdefault(job_base(fields[0]), []).append((fields[1], fields[2]))
    return found


def shown(token: str, states: Iterable[tuple[str, str]]) -> bool:
    """Whether a job's lines show "STATE", "STATE:Reason" or "STATE:*" (a reason set)."""
    state, _, reason = token.partition(":")
    for have, why in states:
        if have == state and (
            not reason or why == reason or (reason == "*" and why not in ("", "None"))
        ):
            return True
    return False


def not_shown(
    wants: Mapping[str, tuple[str, ...]],
    ids: Mapping[str, str],
    queue: Mapping[str, list[tuple[str, str]]],
) -> list[str]:
    return [
        f"{role} {token}"
        for role, tokens in wants.items()
        if role in ids
        for token in tokens
        if not shown(token, queue.get(ids[role], []))
    ]


def wait_for(
    lab: Lab, wants: Mapping[str, tuple[str, ...]], ids: Mapping[str, str], seconds: float
) -> None:
    """Poll squeue until every job shows what it should, for at most `seconds`; what
    has not shown by then is only reported."""
    deadline = time.monotonic() + seconds
    while True:
        missing = not_shown(wants, ids, queue_states(lab))
        if not missing:
            return
        if time.monotonic() >= deadline:
            warn(f"not shown within {seconds:g} s, recorded as it is: {', '.join(missing)}")
            return
        time.sleep(POLL_SECONDS)


# --- setup and cleanup ------------------------------------------------------------------------


def write_scripts(lab: Lab) -> None:
    """The batch scripts, on n1 where sbatch reads them (it sends their text along)."""
    lab.text(["install", "-d", "-m", "755", SCRIPT_DIR])
    for name, body in SCRIPTS.items():
        path = f"{SCRIPT_DIR}/{name}.sh"
        lab.text(["sh", "-c", 'printf %s "$1" > "$2" && chmod 755 "$2"', "sh", body, path])


def take_out_of_service(lab: Lab, facts: Mapping[str, str]) -> None:
    lab.text(nodes.drain_argv(facts["drained"], DRAIN_REASON))
    lab.text(
        reservations.maintenance_argv(facts["reservation"], [facts["drained"]], RESERVATION_MINUTES)
    )


def setup(lab: Lab, facts: Mapping[str, str], seconds: float) -> dict[str, str]:
    """Submit JOBS, take their actions, drain a node, reserve it; the job ids by role."""
    cleanup(lab, facts)
    write_scripts(lab)
    ids = submit_all(lab, EARLY, facts)
    wait_for(lab, {job.role: job.start for job in EARLY}, ids, seconds)
    act_on(lab, EARLY, ids)
    take_out_of_service(lab, facts)
    ids |= submit_all(lab, LATE, {**facts, **ids})
    act_on(lab, LATE, ids)
    wait_for(lab, {job.role: job.shows for job in JOBS}, ids, seconds)
    return ids


def cleanup(lab: Lab, facts: Mapping[str, str]) -> None:
    """Cancel the recorder's jobs, resume the node it drained (while its reason is the
    recorder's), delete its reservation and scripts."""
    jobs = queued_recorder_jobs(lab)
    if jobs:
        lab.run(["scancel", *jobs])
    node = lab.run(["scontrol", "show", "node", "--oneliner", facts["drained"]])
    if f"Reason={DRAIN_REASON}".encode() in node.stdout:
        lab.text(["scontrol", "update", f"NodeName={facts['drained']}", "State=RESUME"])
    if lab.run(["scontrol", "show", "reservation", facts["reservation"]]).code == 0:
        lab.text(["scontrol", "delete", f"ReservationName={facts['reservation']}"])
    lab.run(["rm", "-rf", SCRIPT_DIR])


def cleanup_quietly(lab: Lab, facts: Mapping[str, str]) -> None:
    try:
        cleanup(lab, facts)
    except LabFailure as exc:
        warn(f"cleanup failed: {exc}")


# --- recording ---------------------------------------------------------------------------------


def filled(recording: Recording, facts: Mapping[str, str]) -> tuple[str, list[str]]:
    """The recording's node and argv with its placeholders filled; KeyError for one the
    lab has no value for."""
    return recording.node.format_map(facts), [word.format_map(facts) for word in recording.argv]


def clear(directory: Path) -> None:
    """Remove what an earlier run wrote into directory (and only that)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.iterdir():
        if path.is_file() and (path.suffix in SUFFIXES or path.name == MANIFEST):
            path.unlink()


def save(directory: Path, name: str, done: Done) -> list[str]:
    """NAME.out always, NAME.err when stderr is not empty, NAME.rc when the status is not
    0; the file names written."""
    files = {f"{name}.out": done.stdout}
    if done.stderr:
        files[f"{name}.err"] = done.stderr
    if done.code != 0:
        files[f"{name}.rc"] = f"{done.code}\n".encode()
    for file_name, data in files.items():
        (directory / file_name).write_bytes(data)
    return list(files)


class Recorded(NamedTuple):
    files: list[str]
    commands: list[dict]
    skipped: dict[str, str]


def record_all(lab: Lab, facts: Mapping[str, str], directory: Path) -> Recorded:
    result = Recorded([], [], {})
    for recording in RECORDINGS:
        try:
            node, argv = filled(recording, facts)
        except KeyError as missing:
            result.skipped[recording.name] = f"no {missing.args[0]} on this lab"
            continue
        try:
            done = lab.run(argv, recording.user, recording.env, node)
        except NoAnswer as exc:
            result.skipped[recording.name] = str(exc)
            continue
        result.files.extend(save(directory, recording.name, done))
        result.commands.append(
            {
                "name": recording.name,
                "user": recording.user,
                "node": node,
                "env": dict(recording.env),
                "argv": argv,
                "rc": done.code,
            }
        )
    return result


def write_manifest(
    directory: Path, lab: Lab, version: str, facts: Mapping[str, str], recorded: Recorded
) -> None:
    manifest = {
        "slurm": version,
        "debian": lab.text(["cat", "/etc/debian_version"]).strip(),
        "recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recorder": "tools/record_slurm_outputs.py",
        "placeholders": dict(facts),
        "recordings": recorded.commands,
        "skipped": recorded.skipped,
        "not_recorded": [{"rows": rows, "why": why} for rows, why in NOT_RECORDED],
        "files": sorted(recorded.files),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


# --- the command line -------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="record_slurm_outputs.py",
        description="Record real Slurm output for the unit tests (see the module docstring).",
    )
    parser.add_argument("--lab", required=True, help="the tacc-lab lab to record from")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where <major.minor>/ goes (%(default)s)"
    )
    parser.add_argument(
        "--setup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="submit the recorder's jobs, drain a node and reserve it first (default: yes)",
    )
    parser.add_argument(
        "--cleanup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cancel the recorder's jobs, resume the node, delete the reservation after "
        "recording (default: yes)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=WAIT_SECONDS,
        help="seconds each setup wait polls squeue at most (%(default)s)",
    )
    return parser.parse_args(argv)


def record(lab: Lab, args: argparse.Namespace) -> None:
    version = lab.text(["sinfo", "--version"]).strip()
    directory = args.out / version_dir(version)
    facts = lab_facts(lab)
    try:
        ids = setup(lab, facts, args.wait) if args.setup else find_jobs(lab, facts["since"])
        clear(directory)
        recorded = record_all(lab, {**facts, **ids}, directory)
        write_manifest(directory, lab, version, {**facts, **ids}, recorded)
        print(f"{version}: {len(recorded.files)} files in {directory}")
        for name, why in recorded.skipped.items():
            print(f"  skipped {name}: {why}")
    finally:
        if args.cleanup:
            cleanup_quietly(lab, facts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        record(Lab(args.lab), args)
    except LabFailure as exc:
        warn(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
