"""Ansible's linear strategy run over Mitogen (`ANSIBLE_STRATEGY=mitogen_linear`).

Mitogen keeps one Python interpreter per host for the whole run and sends it the
modules, instead of one SSH exec and one Python start per task and host. Measured on
the 3-node lab (bench/converge.py --strategy mitogen_linear): the idempotent re-run of
site.yml takes less than half the time. Host keys are still verified: Mitogen's ssh
method reads host_key_checking and the inventory's ssh arguments (UserKnownHostsFile,
StrictHostKeyChecking=yes). Needs the `mitogen` package in the Ansible venv
(`make venv` installs it).

Opt-in, not ansible.cfg's default: ansible-core 2.19 warns that strategy plug-ins outside
ansible.builtin are deprecated and may be removed in a later release, so the plain linear
strategy stays the path every run can rely on.
"""

import ansible_mitogen.loaders
import ansible_mitogen.strategy

LinearStrategy = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, LinearStrategy):
    """The stock linear strategy with Mitogen's connection and module runner."""
