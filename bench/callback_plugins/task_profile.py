"""Seconds per task and per role of one ansible-playbook run, slowest first (what
ansible.posix's profile_tasks/profile_roles print; that collection is not installed).

    ANSIBLE_CALLBACK_PLUGINS=plugins/callback:bench/callback_plugins \\
        ANSIBLE_CALLBACKS_ENABLED=task_profile ansible-playbook -i INVENTORY playbooks/site.yml

(plugins/callback keeps ansible.cfg's jinja_plugins_preload on the path: the variable
replaces the configured path.)

TASK_PROFILE_TOP (default 40) limits the task list; TASK_PROFILE_JSON=PATH also writes
every task's seconds as JSON. It also counts, per host, the results of tasks that run on
the node (not the controller-only actions below, one per loop item): a measure of a
re-run's cost that the machine's load does not change.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

from ansible.plugins.callback import CallbackBase

# Actions that never reach the node.
CONTROLLER_ONLY = {
    "assert",
    "debug",
    "fail",
    "include_vars",
    "meta",
    "set_fact",
    "validate_argument_spec",
    "include_tasks",
    "import_tasks",
    "include_role",
    "import_role",
}

DOCUMENTATION = """
    name: task_profile
    type: aggregate
    short_description: seconds per task and per role, slowest first
    description: Prints the wall-clock seconds of every task and role at the end of a run.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_profile"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._current: tuple[str, str] | None = None
        self._started = 0.0
        self._tasks: dict[tuple[str, str], float] = defaultdict(float)
        self._run_started = time.monotonic()
        self._node_results: dict[str, int] = defaultdict(int)

    def _count(self, result) -> None:
        task = result._task
        action = (task.action or "").rsplit(".", 1)[-1]
        delegated = task.delegate_to in ("localhost", "127.0.0.1")
        if action not in CONTROLLER_ONLY and not delegated and not result._result.get("results"):
            self._node_results[result._host.get_name()] += 1

    def v2_runner_on_ok(self, result) -> None:
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        self._count(result)

    def v2_runner_item_on_ok(self, result) -> None:
        self._count(result)

    def v2_runner_item_on_failed(self, result) -> None:
        self._count(result)

    def _close(self) -> None:
        if self._current is not None:
            self._tasks[self._current] += time.monotonic() - self._started
            self._current = None

    def _open(self, task) -> None:
        self._close()
        role = task._role.get_name() if task._role else "-"
        self._current = (role, task.get_name())
        self._started = time.monotonic()

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._open(task)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._open(task)

    def v2_playbook_on_play_start(self, play) -> None:
        self._close()

    def v2_playbook_on_stats(self, stats) -> None:
        self._close()
        total = time.monotonic() - self._run_started
        roles: dict[str, float] = defaultdict(float)
        for (role, _), seconds in self._tasks.items():
            roles[role] += seconds
        top = int(os.environ.get("TASK_PROFILE_TOP", "40"))
        in_tasks = sum(roles.values())
        self._display.display(f"\nTASK PROFILE (run {total:.1f} s, in tasks {in_tasks:.1f} s)")
        ranked = sorted(self._tasks.items(), key=lambda kv: -kv[1])
        for (role, name), seconds in ranked[:top]:
            self._display.display(f"{seconds:7.2f} s  {role}: {name}")
        self._display.display("ROLE PROFILE")
        for role, seconds in sorted(roles.items(), key=lambda kv: -kv[1]):
            self._display.display(f"{seconds:7.2f} s  {role}")
        counts = " ".join(f"{h}={n}" for h, n in sorted(self._node_results.items()))
        self._display.display(f"NODE RESULTS (module runs on the node): {counts}")
        path = os.environ.get("TASK_PROFILE_JSON")
        if path:
            rows = [{"role": r, "task": n, "seconds": round(s, 3)} for (r, n), s in ranked]
            report = {"total": round(total, 3), "node_results": self._node_results, "tasks": rows}
            with open(path, "w", encoding="utf-8") as out:
                json.dump(report, out, indent=1)
