"""The tcloud SDK in a few lines: submit examples/hello, stream its logs, wait for it and
download its outputs; then a tiny sweep given as a dict, one trial per learning rate.

    python examples/sdk/run.py [--cluster NAME] [--out DIR]

The cluster is one of tcloud's config (`tcloud config add`, or in the lab
`eval "$(tacc-lab user alice)"`); without --cluster, the current one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tcloud import Cluster, TcloudError

HELLO = Path(__file__).resolve().parent.parent / "hello"

# A task as a dict: the fields of tcloud.yaml. Its code is the directory given as
# base_dir (here an empty one: the task needs no files); each trial gets its parameters
# as environment variables, and TACC_TRIAL (its index).
SWEEP = {
    "name": "sdk-sweep",
    "resources": {"nodes": 1, "mem": "100M", "time": "5"},
    "run": ['echo "trial $TACC_TRIAL: lr=$LR" | tee "$TACC_WORKDIR/outputs/result.txt"'],
    "outputs": ["outputs/"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", help="a cluster of tcloud's config (default: current)")
    parser.add_argument("--out", type=Path, default=Path("sdk-outputs"), help="downloads")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with Cluster(args.cluster) as cluster:
        job = cluster.submit(HELLO)
        print(f"submitted job {job.id} to {job.submission.partition}")
        for line in job.logs(follow=True):  # until the job ends
            print(line)
        print(f"job {job.id}: {job.wait(timeout=300)['state']}")
        print(f"downloaded {job.download(args.out / 'hello')} file(s)")

        code = args.out / "sweep-code"
        code.mkdir(exist_ok=True)
        sweep = cluster.sweep(SWEEP, {"LR": ["0.1", "0.01"]}, base_dir=code)
        final = sweep.wait(timeout=300)
        for trial in final["trials"]:
            print(f"trial {trial['job_id']} {trial['state']} {trial['parameters']}")
        print(f"downloaded {sweep.download(args.out / 'sweep')} file(s)")
    return 0 if final["state"] == "COMPLETED" else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TcloudError as exc:  # the SDK raises; a script decides how to report
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
