"""Per-node checks on every converged lab node (testinfra, all hosts)."""

import testinfra

CONTROLLER = "n1"
CACHED = "/run/slurm/conf/slurm.conf"  # where a configless slurmd keeps what it fetched


def test_munge_key_is_private(host):
    key = host.file("/etc/munge/munge.key")
    assert (key.user, key.group, key.mode) == ("munge", "munge", 0o400)
    assert host.service("munge").is_running


def test_slurm_conf_is_the_controllers_everywhere(host):
    """Configless (slurm_configless: true, the default): the controller keeps slurm.conf;
    every other node has no local copy (it would hide the controller's). A compute node
    runs the one its slurmd fetched from the controller, the same bytes; the login node
    (no slurmd) finds the controller through the cluster DNS, and its commands work."""
    controller = testinfra.get_host(
        f"ansible://{CONTROLLER}", ansible_inventory=host.backend.ansible_inventory
    )
    conf = controller.file("/etc/slurm/slurm.conf")
    assert conf.mode == 0o644
    # n2 and n3 have the same hardware: one hostlist line, addresses paired by position.
    assert "NodeName=n[2-3] NodeAddr=" in conf.content_string
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf.content_string
    if host.backend.get_hostname() == CONTROLLER:
        return
    assert not host.file("/etc/slurm/slurm.conf").exists
    if host.service("slurmd").is_running:
        assert host.file(CACHED).content_string == conf.content_string
    else:
        assert (
            host.check_output("scontrol show config | grep -E '^ClusterName '").split()[-1]
            == "tacc"
        )
