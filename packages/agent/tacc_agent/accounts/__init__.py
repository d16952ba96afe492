"""Slurm accounts that follow the site's directory (issue [21], docs/directory.md): the
inventory maps directory groups to accounts (the agent config's directory_accounts), and
`tacc-agent accounts sync` (root, on the controller, from a timer) keeps each mapped
account's user associations equal to its group's members, and makes each member's
private workspace directory.

mapping.py reads the mapping, membership.py asks the node's NSS (SSSD) who is in each
group, plan.py turns what Slurm has and what the groups say into sacctmgr and scancel
commands (no I/O), sync.py runs them."""
