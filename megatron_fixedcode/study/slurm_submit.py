"""Submitting the study's job graph (``graph.py``) to Slurm: what is not done is submitted with its
dependencies (``sbatch --parsable --dependency=afterok:...``); a job still queued or running from an earlier
invocation is not submitted again (its state from every ``sacct`` line; squeue/scontrol without accounting)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from megatron_fixedcode.study.graph import Job, StudyOptions
from megatron_fixedcode.study.layout import StudyLayout


# Slurm states of a job that will still run (or is running): not resubmitted.
IN_FLIGHT = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "CONFIGURING",
    "COMPLETING",
    "RESIZING",
    "SUSPENDED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
}


def _combined_state(states: list[str]) -> str | None:
    """One state for a job from the states of all its records (array tasks): in flight while any task
    is, else the first that did not complete, else COMPLETED."""
    for state in states:
        if state in IN_FLIGHT:
            return state
    return next((s for s in states if s != "COMPLETED"), states[0] if states else None)


def slurm_state(job_id: str, log=print) -> str | None:
    """The job's state from every line sacct prints for it (an array job: one per task) and from the
    controller (squeue, then scontrol, which forget a job MinJobAge after it ends): slurmdbd lags the
    controller, so an array whose pending remainder it has not recorded yet reads COMPLETED from sacct
    alone. None when Slurm does not know the job."""
    states: list[str] = []
    if shutil.which("sacct") is not None:
        res = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], capture_output=True, text=True
        )
        states = [s.split()[0] for s in res.stdout.split("\n") if s.strip()] if res.returncode == 0 else []
        if res.returncode != 0:
            log(
                f"sacct failed ({res.stderr.strip() or res.returncode}): job {job_id}'s state from squeue/scontrol instead"
            )
        if states and _combined_state(states) in IN_FLIGHT:
            return _combined_state(states)
    return _combined_state(states + _controller_states(job_id))


def _controller_states(job_id: str) -> list[str]:
    """The states slurmctld still holds for the job's records (none once it forgot the job)."""
    if shutil.which("squeue") is None:
        return []
    res = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True)
    states = [s.strip() for s in res.stdout.splitlines() if s.strip()] if res.returncode == 0 else []
    if not states and shutil.which("scontrol") is not None:
        res = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True)
        states = re.findall(r"\bJobState=(\S+)", res.stdout) if res.returncode == 0 else []
    return states


def _sbatch(args: list[str]) -> str:
    res = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise ValueError(f"sbatch {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]


def _tasks(out: str) -> str:
    m = re.search(r"^# tasks to run: (\S+)", out, re.M)
    return m.group(1) if m else "?"


def submit(opts: StudyOptions, jobs: list[Job], log=print) -> dict[str, str]:
    """Submit every job that is not done; returns {name: job id} of the submitted or in-flight jobs."""
    layout = StudyLayout(Path(opts.study_dir))
    layout.jobs.mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    ids: dict[str, str] = {}
    for j in jobs:
        if j.done:
            log(f"{j.name}: done ({', '.join(j.outputs)})")
            continue
        if j.problem:
            log(f"{j.name}: {j.problem}: redoing it")
        if j.name == "manifest" and "manifest" in ids:
            continue  # submitted with the array just now
        id_file = layout.jobs / f"{j.name}.id"
        if j.name == "index" and not id_file.is_file() and (layout.jobs / "manifest.id").is_file():
            id_file = layout.jobs / "manifest.id"  # submitted without an array (every shard was complete)
        if id_file.is_file():
            old = id_file.read_text().strip()
            state = slurm_state(old, log)
            if j.name == "index" and state not in IN_FLIGHT and (layout.jobs / "manifest.id").is_file():
                # the array ended, its manifest job may not have: then neither is resubmitted
                manifest = (layout.jobs / "manifest.id").read_text().strip()
                manifest_state = slurm_state(manifest, log)
                if manifest_state in IN_FLIGHT:
                    ids[j.name] = old
                    log(
                        f"index: job {old} ended {state}, its manifest job {manifest} is {manifest_state}: not resubmitted"
                    )
                    continue
            if state in IN_FLIGHT:
                ids[j.name] = old
                log(f"{j.name}: job {old} is {state}: not resubmitted")
                continue
            if state is not None:
                log(f"{j.name}: job {old} ended {state}: resubmitting")
        if j.name == "manifest":
            continue  # examples/preprocess_shards.sh submits it with the array (the index job, resubmitted)
        deps = [ids[d] for d in j.deps if d in ids]
        if j.stage == "index":
            res = subprocess.run(shlex.split(j.script), capture_output=True, text=True)
            if res.returncode != 0:
                raise ValueError(f"examples/preprocess_shards.sh failed: {res.stderr.strip()}")
            m = re.search(r"submitted: (?:array job (\S+)|no array job) .*manifest job (\S+)", res.stdout)
            if not m:
                raise ValueError(f"examples/preprocess_shards.sh: no job ids in its output: {res.stdout}")
            ids["manifest"] = m.group(2)
            (layout.jobs / "manifest.id").write_text(ids["manifest"] + "\n")
            if m.group(1):
                ids["index"] = m.group(1)
                (layout.jobs / "index.id").write_text(ids["index"] + "\n")
                log(f"index: array job {ids['index']} (tasks {_tasks(res.stdout)}), manifest job {ids['manifest']}")
            else:
                (layout.jobs / "index.id").unlink(missing_ok=True)
                log(f"index: every shard complete, no array; manifest job {ids['manifest']}")
            continue
        script = layout.jobs / f"{j.name}.sh"
        script.write_text(j.script)
        args = [*j.sbatch, *([f"--dependency=afterok:{':'.join(deps)}"] if deps else []), str(script)]
        ids[j.name] = _sbatch(args)
        id_file.write_text(ids[j.name] + "\n")
        log(f"{j.name}: job {ids[j.name]}" + (f" after {', '.join(d for d in j.deps if d in ids)}" if deps else ""))
    return ids
