"""Load Ansible's Jinja filter and test plug-ins once, in the controller process, before
each task's workers are forked, so that every worker inherits them.

Why: ansible-core (2.19) runs each task on each host in a worker process forked from
the controller. The first filter or test a worker uses makes it import every filter and
test plug-in on the path (ansible.builtin's and the roles' filter_plugins/), unless the
controller had loaded them before the fork. Loading a role adds its plug-in directory,
which empties that cache, and the controller itself rarely needs a filter, so in a
site.yml run nearly every worker imported them all again: about 20 ms per task and host,
935 times in an idempotent re-run of the 3-node lab (py-spy of the run; bench/converge.py
measures the whole run, docs/provisioning.md has the numbers).

Nothing else changes: the same plug-ins, found the same way, in the same order; a worker
that finds them loaded uses them as it would have after loading them itself. Needs no
enabling: ansible.cfg's callback_plugins puts it on the path.
"""

from __future__ import annotations

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
    name: jinja_plugins_preload
    type: aggregate
    short_description: load the Jinja filter and test plug-ins before workers fork
    description:
      - Loads every Jinja filter and test plug-in in the controller at the start of each
        task and handler, so the forked workers inherit them instead of each loading them.
"""

# A plug-in that is always there: asking for it makes each loader load them all
# (Jinja2Loader loads every non-collection plug-in on its first lookup and keeps them).
ANY_FILTER = "ansible.builtin.bool"
ANY_TEST = "ansible.builtin.truthy"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "jinja_plugins_preload"
    CALLBACK_NEEDS_ENABLED = False

    def preload(self) -> None:
        """Each loader's plug-ins, loaded when a role's directory emptied its cache
        (a lookup that finds them loaded costs a dictionary lookup)."""
        filter_loader.get(ANY_FILTER)
        test_loader.get(ANY_TEST)

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self.preload()

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self.preload()
