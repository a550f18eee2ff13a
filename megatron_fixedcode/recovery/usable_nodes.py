"""Which nodes a relaunch on fewer nodes runs on (issue 62: a node that fails is cut out, not waited for).

After a failed attempt the Slurm launcher asks this module, from the batch script, which of the job's nodes are
still usable and whether to relaunch ``srun`` on them at the largest node count that keeps the global batch
(recovery/node_plan.py). A node is cut out when

* **lost**: Slurm no longer lists it in the job, or reports it in a state where nothing may run (``sinfo``);
* **bad**: its ranks failed at the last two attempts, both failed (the attempts' record and the ranks' failure
  reports, recovery/attempt_reports.py), even if Slurm calls it up: a node that failed twice in a row would
  most likely fail the relaunch too.

A failure with every node healthy is no node loss: it does not shrink the run (the in-job restarts and the
requeue are for it). No torch, no process group: Slurm's commands, JSON and arithmetic only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import socket
import subprocess
import sys

from megatron_fixedcode.errors import is_collective_failure_text
from megatron_fixedcode.recovery.attempt_reports import report_path
from megatron_fixedcode.recovery.attempts import Attempts
from megatron_fixedcode.recovery.node_plan import NodeCount, choose, from_config

# Usable: Slurm may run the job's tasks there now (sinfo's %t): idle, allocated, mixed, completing (the failed
# step's processes still ending), reserved, planned. Any other state (down, drain, drng, fail, failg, maint, unk,
# boot, inval, npc, power states ...) is not, nor any flag but '-': '*' not responding, '~' powered off, '#'
# powering up, '%' powering down, '!' pending power down, '$' maintenance, '@' pending reboot, '^' rebooting.
USABLE_STATES = frozenset({"idle", "alloc", "mix", "comp", "resv", "plnd"})
USABLE_FLAGS = frozenset({"", "-"})
STATE_WORDS = {"drng": "draining", "drain": "drained", "failg": "failing", "fail": "failed", "unk": "unknown"}
FLAG_WORDS = {"*": "not responding", "~": "powered off", "#": "powering up", "%": "powering down"}
FLAG_WORDS |= {"!": "pending power down", "$": "in maintenance", "@": "pending reboot", "^": "rebooting"}
# Reports that are no failure of the reporting rank's node: a rank still waiting in a section near its timeout
# (in_job_restarts.py's _overdue), and the first line of a failure is_collective_failure accepted that names no
# transport (an empty message gives the type's name; a save's CheckpointException gathers the peers' errors).
PEER_REPORTS = (
    "still in its '",
    "CheckpointException",
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStore",
)
SLURM_TIMEOUT_S = 60
ERROR_CHARS = 160  # of a rank's error in a why


class SlurmError(RuntimeError):
    """A Slurm command failed or said something unreadable: no relaunch can be decided."""


def _slurm(*args: str) -> str:
    try:
        res = subprocess.run(list(args), capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"`{shlex.join(args)}` failed: {e}") from e
    if res.returncode:
        detail = (res.stderr.strip().splitlines() or [""])[-1].strip()
        raise SlurmError(f"`{shlex.join(args)}` exited {res.returncode}" + (f": {detail}" if detail else ""))
    return res.stdout


def job_nodes(job: str) -> tuple[list[str], str | None]:
    """(the nodes Slurm still counts in the job, in its order; its batch host, None if it names none)."""
    line = (_slurm("scontrol", "show", "job", "-o", job).strip().splitlines() or [""])[0]
    fields = {}
    for token in line.split():
        key, _, value = token.partition("=")
        fields.setdefault(key, value)  # NodeList, not ReqNodeList or ExcNodeList: keys match whole
    listed = fields.get("NodeList", "")
    if listed in ("", "(null)"):
        raise SlurmError(f"job {job} has no nodes (NodeList={listed or 'missing'}): is it running?")
    nodes = _slurm("scontrol", "show", "hostnames", listed).split()
    if not nodes:
        raise SlurmError(f"`scontrol show hostnames {listed}` named no node")
    batch = fields.get("BatchHost")
    return nodes, batch if batch not in (None, "", "(null)") else None


def slurm_states(nodes: list[str]) -> dict[str, str]:
    """node -> its state as ``sinfo -N`` prints it (``%t``: ``alloc``, ``down*``, ``drng`` ...); a node listed
    in several partitions keeps its unusable state if one line has it."""
    states: dict[str, str] = {}
    for line in _slurm("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t").splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        node, state = parts
        if node not in states or usable_state(states[node]):
            states[node] = state
    return states


def usable_state(state: str) -> bool:
    base = state.rstrip("*~#%!$@^-").lower()
    return base in USABLE_STATES and state[len(base) :] in USABLE_FLAGS


def describe_state(state: str) -> str:
    base = state.rstrip("*~#%!$@^-")
    words = [STATE_WORDS.get(base.lower(), base.lower())] + [
        FLAG_WORDS[f] for f in state[len(base) :] if f in FLAG_WORDS
    ]
    return f"Slurm reports it {', '.join(words)} ({state})"


def lost_nodes(nodes: list[str], states: dict[str, str]) -> dict[str, str]:
    """The job's nodes Slurm reports in a state that is not usable (or not at all): node -> why."""
    return {
        n: "sinfo does not report it" if n not in states else describe_state(states[n])
        for n in nodes
        if n not in states or not usable_state(states[n])
    }


# -- the attempts' record: whose ranks failed -------------------------------------------------------------
def _report(path: str) -> dict | None:
    """A rank's failure report; None if it left none; {} if torn (it was alive to write it)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        report = json.loads(text)
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def own_failure(error: str | None) -> bool:
    """A reported error of the rank's own (a CUDA error, an exception), not a peer's collective failure."""
    text = (error or "").strip()
    return bool(text) and not (is_collective_failure_text(text) or text.startswith(PEER_REPORTS))


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def failed_hosts(attempts: Attempts, record: dict) -> dict[str, list[str]]:
    """host -> what its ranks did, for the hosts whose ranks failed at this attempt: one left no report while
    others did (it died or hung), or one reported an error of its own. Nothing when no rank reported: the
    whole attempt was stopped (a cancel, a time limit), no node to blame."""
    runs = record.get("hosts") or []
    if not attempts.path or not runs:
        return {}
    reports = {}
    for host, first, last in runs:
        for rank in range(first, last + 1):
            reports[rank] = (host, _report(report_path(attempts.path, record["attempt"], rank)))
    if all(report is None for _, report in reports.values()):
        return {}
    silent: dict[str, list[int]] = {}
    own: dict[str, list[tuple[int, str]]] = {}
    for rank, (host, report) in sorted(reports.items()):
        if report is None:
            silent.setdefault(host, []).append(rank)
        elif own_failure(report.get("error")):
            own.setdefault(host, []).append((rank, " ".join(str(report["error"]).split())))
    failed: dict[str, list[str]] = {}
    for host in sorted(set(silent) | set(own), key=[h for h, _, _ in runs].index):
        notes = [f"{_ranks(silent[host])} died or hung"] if host in silent else []
        if host in own:
            rank, error = own[host][0]
            error = error if len(error) <= ERROR_CHARS else error[: ERROR_CHARS - 3] + "..."
            more = len(own[host]) - 1
            notes.append(f"rank {rank}: {error}" + (f" (and {more} more rank(s) with errors)" if more else ""))
        failed[host] = notes
    return failed


def bad_nodes(attempts: Attempts) -> dict[str, str]:
    """The nodes whose ranks failed at each of the last two attempts, both failed: node -> why. Not when both
    failed at the same step: that is the run's own failure, which a restart cannot fix on any nodes
    (:meth:`Attempts.refusal` ends the job saying so), not a node's."""
    if len(attempts.records) < 2 or not all(attempts._failed(r) for r in attempts.records[-2:]):
        return {}
    a, b = attempts.records[-2:]
    if attempts.failed_step(a) is not None and attempts.failed_step(a) == attempts.failed_step(b):
        return {}
    at_a, at_b = failed_hosts(attempts, a), failed_hosts(attempts, b)
    return {
        host: f"its ranks failed at attempts {a['attempt']} and {b['attempt']} "
        f"(attempt {a['attempt']}: {'; '.join(at_a[host])}; attempt {b['attempt']}: {'; '.join(at_b[host])})"
        for host in at_b
        if host in at_a
    }


# -- the decision -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Decision:
    relaunch: bool
    why: str  # one line: what the relaunch runs on, or why there is none
    nodes: list[str]  # to relaunch on, the rendezvous host (the batch host when usable) first; [] without one
    lost: dict[str, str]  # cut out by Slurm: node -> why
    bad: dict[str, str]  # cut out by the attempts' record: node -> why
    count: NodeCount | None = None  # the chosen node count, dp and microbatches per rank

    @property
    def cut_out(self) -> dict[str, str]:
        """Every node cut out, lost or bad (both: both whys), in the order found."""
        both = {n: self.lost[n] for n in self.lost}
        for n, why in self.bad.items():
            both[n] = f"{both[n]}; {why}" if n in both else why
        return both


def combine(
    nodes: list[str],
    states: dict[str, str],
    attempts: Attempts,
    layout: dict[str, int],
    *,
    start_nodes: int | None = None,
    min_nodes: int = 1,
    batch_host: str | None = None,
) -> Decision:
    """The decision from what Slurm and the attempts say. ``layout``: gpus_per_node and node_plan.from_config's
    model_parallel, global_batch, micro_batch; ``start_nodes``: the job's node count at its start (default: the
    nodes of the last attempt, else those Slurm lists now)."""
    last_hosts = [h for h, _, _ in (attempts.records[-1].get("hosts") or [])] if attempts.records else []
    last_hosts = list(dict.fromkeys(last_hosts))
    start = start_nodes or len(last_hosts) or len(nodes)
    lost = {h: "no longer in the job's node list (Slurm removed it)" for h in last_hosts if h not in nodes}
    lost |= lost_nodes(nodes, states)
    bad = bad_nodes(attempts)
    cut = Decision(False, "", [], lost, bad).cut_out

    def no(why: str) -> Decision:
        return Decision(False, why, [], lost, bad)

    if not cut and len(nodes) >= start:
        return no(
            f"nothing was cut out: the job's {len(nodes)} node(s) are up and none failed at the last two attempts "
            "(a failure on healthy nodes is not a node loss: no relaunch on fewer nodes)"
        )
    gone = f"{len(cut)} node(s) cut out ({' | '.join(f'{n}: {w}' for n, w in cut.items())})" if cut else ""
    if not cut:
        gone = f"the job has {len(nodes)} of its {start} node(s)"
    if batch_host in cut:
        return no(f"{gone}; the batch host {batch_host} itself is cut out: no relaunch on fewer nodes (requeue)")
    usable = [n for n in nodes if n not in cut]
    if not usable:
        return no(f"{gone}; no usable node left: no relaunch on fewer nodes")
    count, why = choose(min(len(usable), start), min_nodes=min_nodes, **layout)
    if count is None:
        return no(f"{gone}; {why}")
    # the batch host first (the rendezvous); nodes whose ranks failed at the last attempt last, left out first
    suspect = set(failed_hosts(attempts, attempts.records[-1])) if attempts.records else set()
    order = sorted(usable, key=lambda n: (n != batch_host, n in suspect))
    return Decision(True, f"{gone}; {why}", order[: count.nodes], lost, bad, count)


def decide(
    job: str,
    attempts_file: str | None,
    config: dict,
    *,
    gpus_per_node: int,
    start_nodes: int | None = None,
    min_nodes: int = 1,
    batch_host: str | None = None,
) -> Decision:
    """Ask Slurm about ``job``'s nodes, read the attempts and decide. ``config``: the trainer's resolved config
    (``--dry-run``); ``batch_host`` default: SLURMD_NODENAME, the job's BatchHost, this host's name. Raises
    SlurmError when a Slurm command fails, ValueError for a config without its batch sizes."""
    layout = dict(gpus_per_node=gpus_per_node, **from_config(config))
    nodes, slurm_batch = job_nodes(job)
    host = batch_host or os.environ.get("SLURMD_NODENAME") or slurm_batch or socket.gethostname()
    return combine(
        nodes,
        slurm_states(nodes),
        Attempts.read(attempts_file),
        layout,
        start_nodes=start_nodes,
        min_nodes=min_nodes,
        batch_host=host,
    )


def shell_lines(decision: Decision) -> list[str]:
    """The launcher's ``KEY=value`` lines (every key, empty when it has no value), values shell-quoted."""
    count = decision.count
    values = {
        "MFC_RELAUNCH": "1" if decision.relaunch else "0",
        "MFC_RELAUNCH_WHY": decision.why,
        "MFC_RELAUNCH_NODES": ",".join(decision.nodes),
        "MFC_RELAUNCH_COUNT": str(count.nodes) if count else "",
        "MFC_RELAUNCH_DP": str(count.dp) if count else "",
        "MFC_RELAUNCH_MICROBATCHES": str(count.microbatches) if count else "",
        "MFC_RENDEZVOUS_HOST": decision.nodes[0] if decision.nodes else "",
        "MFC_CUT_OUT_NODES": ",".join(decision.cut_out),
        "MFC_CUT_OUT": " | ".join(f"{n}: {w}" for n, w in decision.cut_out.items()),
    }
    return [f"{k}={shlex.quote(v)}" for k, v in values.items()]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        print(f"usable_nodes: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """The ``KEY=value`` lines on stdout (exit 0, also when a Slurm command failed: MFC_RELAUNCH=0 and why);
    bad arguments or an unreadable config: one line on stderr, exit 2."""
    p = _Parser(prog="python -m megatron_fixedcode.recovery.usable_nodes", description=__doc__)
    p.add_argument("--job", required=True, help="the Slurm job id")
    p.add_argument("--attempts", required=True, help="the attempts' record ($MFC_ATTEMPTS_FILE); may not exist yet")
    p.add_argument("--config-json", required=True, help="the trainer's --dry-run config: a file, or - for stdin")
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--nodes", type=int, help="the job's node count at its start (default: $SLURM_JOB_NUM_NODES)")
    p.add_argument("--min-nodes", type=int, default=1, help="never fewer nodes than this (MIN_NODES)")
    p.add_argument("--batch-host", help="the node running the batch script (default: $SLURMD_NODENAME)")
    a = p.parse_args(argv)
    start = a.nodes
    if start is None and (os.environ.get("SLURM_JOB_NUM_NODES") or "").isdigit():
        start = int(os.environ["SLURM_JOB_NUM_NODES"])
    if not re.fullmatch(r"[0-9]+([_+][0-9]+)?", a.job):
        p.error(f"--job {a.job!r}: give a Slurm job id")
    small = [f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if isinstance(v, int) and v < 1]
    if small:
        p.error(f"{', '.join(small)}: give whole numbers of 1 or more")
    try:
        text = sys.stdin.read() if a.config_json == "-" else open(a.config_json).read()
        config = json.loads(text)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        from_config(config)
    except (OSError, ValueError, KeyError, TypeError) as e:  # json's errors are ValueErrors
        p.error(f"--config-json {a.config_json}: {e}")
    try:
        decision = decide(
            a.job,
            a.attempts,
            config,
            gpus_per_node=a.gpus_per_node,
            start_nodes=start,
            min_nodes=a.min_nodes,
            batch_host=a.batch_host,
        )
    except SlurmError as e:
        decision = Decision(False, f"{e}: no relaunch on fewer nodes", [], {}, {})
    print("\n".join(shell_lines(decision)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
