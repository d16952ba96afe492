"""What the slurm role's sacctmgr modules (slurm_qos, slurm_accounts) share: reading a
table with `sacctmgr show`, and running the commands a module planned.

Ansible ships a role's module_utils/ with the role's modules, as
ansible.module_utils.tacc_sacctmgr (the unit tests put this folder on that package's path).
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule


def show(module: AnsibleModule, *args: str) -> str:
    """`sacctmgr -n -P show ARGS`; the module fails with sacctmgr's words if it does."""
    rc, out, err = module.run_command(["sacctmgr", "--noheader", "--parsable2", "show", *args])
    if rc != 0:
        module.fail_json(msg=f"sacctmgr show {args[0]} failed: {err.strip() or out.strip()}")
    return out


def run_planned(module: AnsibleModule, commands: list[list[str]]) -> None:
    """Each planned command in order, none in check mode; the first failure fails the
    module, naming the command and what sacctmgr said."""
    if module.check_mode:
        return
    for argv in commands:
        rc, out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg=f"{' '.join(argv)} failed: {err.strip() or out.strip()}")
