"""The submitit side of `benches/slurm_vs_submitit.rs`: N trivial function jobs on Slurm.

Usage: submitit_jobs.py MODE N FOLDER PARTITION NAME
  MODE  `array`: one `map_array` (submitit's way to run many calls as one job array);
        `single`: N `submit` calls (one sbatch each).
Waits for every result the way a submitit user does (`job.result()` in order) and prints one
JSON line: the wall time from the first submit to the last result, what `sbatch`, `squeue`
and `sacct` resolve to through PATH (the bench checks they are its counting wrappers), and
submitit's own count of its status calls.
"""

import json
import shutil
import sys
import time

import submitit


def trivial(i):
    return i


def main():
    mode, n, folder, partition, name = sys.argv[1:6]
    n = int(n)
    which = {c: shutil.which(c) for c in ("sbatch", "squeue", "sacct", "scontrol", "scancel")}
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    # The same request as the puzzletron side: 1 task, 1 CPU, 5 minutes, the partition's
    # default memory.
    ex.update_parameters(
        partition=partition, time=5, ntasks_per_node=1, cpus_per_task=1, job_name=name
    )
    t = time.monotonic()
    if mode == "array":
        jobs = ex.map_array(trivial, range(n))
    elif mode == "single":
        jobs = [ex.submit(trivial, i) for i in range(n)]
    else:
        sys.exit(f"unknown mode {mode!r}")
    submitted = time.monotonic() - t
    results = [j.result() for j in jobs]
    wall = time.monotonic() - t
    if results != list(range(n)):
        sys.exit("wrong results")
    print(
        json.dumps(
            {
                "mode": mode,
                "jobs": n,
                "submit_seconds": submitted,
                "total_seconds": wall,
                "which": which,
                "watcher_calls": submitit.SlurmJob.watcher.num_calls,
            }
        )
    )


if __name__ == "__main__":
    main()
