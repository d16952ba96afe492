"""A stand-in for a training script: each node reports in and writes its result."""

import json
import os
import socket

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
host = socket.gethostname()
master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
print(f"{os.environ['GREETING']}: rank {rank}/{world} on {host}, master {master}")
loss = 1.0 / (rank + 1)
out = os.path.join(os.environ["TACC_WORKDIR"], "outputs", f"rank{rank}.json")
with open(out, "w") as handle:
    json.dump({"rank": rank, "host": host, "loss": loss}, handle)
