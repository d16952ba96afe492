"""Real ansible-playbook runs on this machine, no lab (and the other multi-second
subprocess work: a fresh venv that pip installs into): the roles and playbooks rendered
and validated by Ansible itself. `make check` leaves these out; `make test` runs them."""
