"""Per-node checks on every converged lab node (testinfra, all hosts)."""


def test_munge_key_is_private(host):
    key = host.file("/etc/munge/munge.key")
    assert (key.user, key.group, key.mode) == ("munge", "munge", 0o400)
    assert host.service("munge").is_running


def test_slurm_conf_is_the_same_everywhere(host):
    conf = host.file("/etc/slurm/slurm.conf")
    assert conf.mode == 0o644
    # n2 and n3 have the same hardware: one hostlist line, addresses paired by position.
    assert "NodeName=n[2-3] NodeAddr=" in conf.content_string
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf.content_string
