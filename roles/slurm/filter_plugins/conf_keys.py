"""Jinja filter: the keys of slurm_extra_config that would give slurm.conf a second line
for one key, each with what to do instead.

slurm.conf keys are case-insensitive (Slurm 22.05 src/common/parse_config.c compares them
with strcasecmp), so `selecttypeparameters` in slurm_extra_config clashes with the
template's `SelectTypeParameters` line. Which keys the template writes, and the role
variable that sets each, is the role's `slurm_conf_template_keys` (vars/main.yml), which a
unit test checks against roles/slurm/templates/slurm.conf.j2.
"""

from __future__ import annotations

from collections.abc import Mapping


def tacc_slurm_extra_config_clashes(
    extra_config: Mapping[str, object], template_keys: Mapping[str, str | None]
) -> list[str]:
    """One line per clashing key of `extra_config`, in its order: the key as written and
    the role variable to set instead (or that the role writes it fixed); also a key given
    twice in different cases. Empty when nothing clashes."""
    template = {key.lower(): (key, variable) for key, variable in template_keys.items()}
    clashes: list[str] = []
    first_spelling: dict[str, str] = {}
    for key in map(str, extra_config):
        folded = key.lower()
        if folded in template:
            written, variable = template[folded]
            advice = f"set {variable} instead" if variable else "the role writes it fixed"
            clashes.append(f"{key} (the template writes {written}: {advice})")
        elif folded in first_spelling:
            clashes.append(f"{key} (the same key as {first_spelling[folded]}: keep one)")
        first_spelling.setdefault(folded, key)
    return clashes


class FilterModule:
    def filters(self) -> dict:
        return {"tacc_slurm_extra_config_clashes": tacc_slurm_extra_config_clashes}
