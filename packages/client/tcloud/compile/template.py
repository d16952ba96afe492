"""The commented task file `tcloud init` writes."""

from __future__ import annotations

TEMPLATE = """\
# tcloud task file: `tcloud validate` checks it, `tcloud submit` runs it.
# Every key is documented in docs/tcloud.md; unknown keys are errors.
name: {name}                 # letters, digits, _ . -

code:
  workdir: .                 # uploaded (only what changed); .tcloudignore is honoured
  include: ["**"]
  exclude: ["*.ckpt", "outputs/"]

resources:
  nodes: 1
  gpus_per_node: 1
  cpus: 8                    # per task (one task per node)
  mem: 32G
  time: "02:00:00"           # Slurm time: MM, HH:MM:SS, D-HH:MM:SS
  # partition: batch
  # qos: urgent
  # priority: 0              # nice value: higher runs later
  # account: mylab
  # sbatch: {{exclusive: ""}}  # any other sbatch option

environment:
  requirements:              # pip lines; the venv is built once and cached per set
    - numpy
  modules: []                # `module load` lines
  env:
    OMP_NUM_THREADS: "8"

datasets: []
  # - {{name: imagenet, cluster: /shared/datasets/imagenet}}   # already on the cluster
  # - {{name: small, local: ./data}}                           # uploaded with the code

setup: []                    # once, on the first node, before run
run:                         # each line is its own command, on every node
  - python -c "import numpy; print(numpy.__version__)"

outputs: ["outputs/"]        # what `tcloud download` fetches

runtime:
  launcher: srun             # srun | torchrun | mpirun | none
  transport: auto            # auto | rdma | tcp (NCCL settings)
"""


def render_template(name: str) -> str:
    return TEMPLATE.format(name=name)
