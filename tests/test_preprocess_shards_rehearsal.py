"""Rehearsal of examples/preprocess_shards.sh on one machine (issue 12): 12 shards of the shared
corpus (Parquet, JSONL.gz and JSONL; one without ids; one corrupt) go through the real array
script under sbatch/srun shims with 3 array tasks; one task is SIGKILLed midway, the same command
is re-submitted, and the outputs must equal one-process indexing per shard byte for byte, the
corrupt shard be named, the manifest list exactly the good shards, and training from
--data-manifest read the same samples as training from the prefixes."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "preprocess_shards.sh"
SHARED = Path(os.environ.get("MFC_SHARED_DATA", REPO.parent / "shared" / "data"))
TOKENIZER = SHARED / "tokenizers" / "smollm2"
FLAGS = ["--id-key", "id", "--append-eod", "--valid-fraction", "0.05", "--min-doc-tokens", "65"]
NUM_SHARDS, CORRUPT, NO_ID, BIG = 12, "s10", "s02", "s05"

SBATCH = r"""#!/usr/bin/env bash
# sbatch shim: runs the batch script asynchronously as Slurm would: every task of --array at once
# (SLURM_ARRAY_JOB_ID/TASK_ID set), a --dependency=afterany:J job once all of J's tasks ended;
# --output patterns %A %a %j; prints the job id (--parsable). Task pids/exit codes in $SHIM_DIR/jobN.
array= dep= out=slurm-%j.out
while [[ ${1:-} == -* ]]; do
    case $1 in
        --array=*) array=${1#--array=} ;;
        --dependency=afterany:*) dep=${1#--dependency=afterany:} ;;
        --output=*) out=${1#--output=} ;;
        --export=*) for kv in $(tr , ' ' <<<"${1#--export=}"); do [[ $kv == *=* ]] && export "$kv"; done ;;
    esac
    shift
done
script=$1; shift
job=$(( $(cat "$SHIM_DIR/next_job" 2>/dev/null || echo 1000) + 1 )); echo "$job" >"$SHIM_DIR/next_job"
dir=$SHIM_DIR/job$job; mkdir -p "$dir"
tasks=(0)
if [[ -n $array ]]; then range=${array%%\%*}; tasks=($(seq "${range%-*}" "${range#*-}")); fi
echo "${#tasks[@]}" >"$dir/ntasks"
for t in "${tasks[@]}"; do
    log=${out//%A/$job}; log=${log//%a/$t}; log=${log//%j/$job}
    (
        if [[ -n $dep ]]; then
            until (( $(ls "$SHIM_DIR/job$dep/"*.rc 2>/dev/null | wc -l) >= $(cat "$SHIM_DIR/job$dep/ntasks") )); do sleep 0.2; done
        fi
        export SLURM_JOB_ID=$job SLURM_CPUS_PER_TASK=1
        [[ -n $array ]] && export SLURM_ARRAY_JOB_ID=$job SLURM_ARRAY_TASK_ID=$t
        setsid bash -c 'echo $$ >"$0"; exec bash "$@"' "$dir/$t.pid" "$script" "$@" >"$log" 2>&1
        echo $? >"$dir/$t.rc"
    ) >/dev/null 2>&1 &
done
echo "$job"
"""

SRUN = r"""#!/usr/bin/env bash
# srun shim: one task on this "node": drop the options, run the command in place.
while [[ ${1:-} == -* ]]; do
    case $1 in --ntasks|--nodes|--cpus-per-task|-n|-N|-c) shift 2 ;; *) shift ;; esac
done
exec "$@"
"""


def _paragraphs() -> list[str]:
    texts = []
    for path in sorted((SHARED / "corpus" / "gutenberg").glob("*.txt")):
        texts += [p.strip() for p in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")) if p.strip()]
    return texts


def _write_shards(directory: Path) -> list[Path]:
    import pyarrow
    import pyarrow.parquet

    directory.mkdir(parents=True)
    paragraphs = _paragraphs()[:6000]
    paths = []
    for s in range(NUM_SHARDS):
        name = f"s{s:02d}"
        chunk = paragraphs[s::NUM_SHARDS] * (6 if name == BIG else 1)  # the killed task's 2nd shard: bigger
        records = [{"id": f"{name}:{i}", "text": t} for i, t in enumerate(chunk)]
        if name == NO_ID:
            records = [{"text": t} for t in chunk]
        if s % 3 == 0:
            path = directory / f"{name}.parquet"
            pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
        else:
            path = directory / (f"{name}.jsonl.gz" if s % 3 == 1 else f"{name}.jsonl")
            data = "".join(json.dumps(r) + "\n" for r in records).encode()
            path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
        if name == CORRUPT:
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # a truncated file
        paths.append(path)
    return paths


def _submit(env, inputs, out) -> tuple[int, int]:
    cmd = ["bash", str(SCRIPT), "--input", str(inputs), "--output-dir", str(out), "--tokenizer-model", str(TOKENIZER),
           "--array-size", "3", "--skip-failed", "--", *FLAGS]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    m = re.search(r"array job (\d+) .* manifest job (\d+)", res.stdout)
    assert m, res.stdout
    return int(m.group(1)), int(m.group(2))


def _wait_job(shim: Path, job: int, timeout: float = 600) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    d = shim / f"job{job}"
    while time.monotonic() < deadline:
        if (d / "ntasks").is_file() and len(list(d.glob("*.rc"))) >= int((d / "ntasks").read_text()):
            return {int(p.stem): int(p.read_text()) for p in d.glob("*.rc")}
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not finish in {timeout} s")


@pytest.mark.slow
@pytest.mark.skipif(not TOKENIZER.is_dir(), reason="shared data not found (set MFC_SHARED_DATA)")
def test_array_job_killed_task_resubmitted_matches_one_process_indexing(tmp_path):
    from megatron_fixedcode.data import shards as shard_plan
    from megatron_fixedcode.data.preprocess import PreprocessConfig, preprocess

    inputs = tmp_path / "in"
    paths = _write_shards(inputs)
    shim, out = tmp_path / "shim", tmp_path / "out"
    (shim / "bin").mkdir(parents=True)
    for name, text in (("sbatch", SBATCH), ("srun", SRUN)):
        (shim / "bin" / name).write_text(text)
        (shim / "bin" / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{shim / 'bin'}:{Path(sys.executable).parent}:{env['PATH']}", SHIM_DIR=str(shim),
               VIRTUAL_ENV=sys.prefix, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")

    # --dry-run prints the array plan and submits nothing
    res = subprocess.run(["bash", str(SCRIPT), "--input", str(inputs), "--output-dir", str(out), "--tokenizer-model",
                          str(TOKENIZER), "--array-size", "3", "--dry-run", "--", *FLAGS],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "# 12 shards, 3 array tasks (0-2) of at most 4 shards" in res.stdout
    assert "task 1: s04 s05 s06 s07" in res.stdout and "--array=0-2 " in res.stdout
    assert not out.exists() and not (shim / "next_job").exists()

    # submission 1: task 1 is SIGKILLed while its second shard (the big one) is being written
    index_job, manifest_job = _submit(env, inputs, out)
    pid_file = shim / f"job{index_job}" / "1.pid"
    deadline = time.monotonic() + 600
    while not (out / f"{BIG}_train_text_document.bin.tmp").exists():
        assert time.monotonic() < deadline, "task 1 never started its second shard"
        time.sleep(0.01)
    os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    rcs = _wait_job(shim, index_job)
    assert rcs[1] == -9 % 256 or rcs[1] == 137, rcs
    assert rcs[0] == 0 and rcs[2] == 1  # task 2 holds the corrupt shard: named, the others indexed
    assert f"error: shard {CORRUPT}: {inputs / (CORRUPT + '.jsonl.gz')}" in (out / "logs" / f"index-{index_job}_2.out").read_text()
    assert _wait_job(shim, manifest_job) == {0: 2}
    log = (out / "logs" / f"manifest-{manifest_job}.out").read_text()
    assert f"{BIG} (missing)" in log and "re-submit" in log
    assert not (out / "manifest.json").exists()
    # the killed shard looks complete nowhere: no summary, its outputs at most as .tmp
    assert not (out / f"{BIG}_summary.json").exists()
    killed_left = {p.name for p in out.glob(f"{BIG}_*")}
    assert all(n.endswith(".tmp") or n.endswith(".lock") for n in killed_left), killed_left

    # submission 2: the same command; only what is missing is indexed
    index_job, manifest_job = _submit(env, inputs, out)
    rcs = _wait_job(shim, index_job)
    assert rcs == {0: 0, 1: 0, 2: 1}
    assert "task 0: 0 indexed, 4 already complete, 0 failed" in (out / "logs" / f"index-{index_job}_0.out").read_text()
    assert "task 1: 3 indexed, 1 already complete, 0 failed" in (out / "logs" / f"index-{index_job}_1.out").read_text()
    assert _wait_job(shim, manifest_job) == {0: 0}
    log = (out / "logs" / f"manifest-{manifest_job}.out").read_text()
    assert f"excluded {CORRUPT}: {inputs / (CORRUPT + '.jsonl.gz')}" in log
    assert not list(out.glob("*.tmp"))

    # byte-identical to one process per shard (preprocess_data.py's library path; its CLI for one)
    good = [p for p in paths if shard_plan.shard_name(p) != CORRUPT]
    ref = tmp_path / "ref"
    for p in good:
        name = shard_plan.shard_name(p)
        if name == NO_ID:
            cli = [sys.executable, str(REPO / "tools" / "preprocess_data.py"), "--input", str(p), "--output-prefix",
                   str(ref / name), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(TOKENIZER), *FLAGS]
            assert subprocess.run(cli, env=env, capture_output=True, timeout=600).returncode == 0
        else:
            preprocess(PreprocessConfig(input=[str(p)], output_prefix=str(ref / name), tokenizer_type="HuggingFaceTokenizer",
                                        tokenizer_model=str(TOKENIZER), id_key="id", append_eod=True,
                                        valid_fraction=0.05, min_doc_tokens=65))
    produced = {p.name: p.read_bytes() for p in sorted(out.glob("*_document.*"))}
    reference = {p.name: p.read_bytes() for p in sorted(ref.glob("*_document.*"))}
    assert len(produced) == len(good) * 4 and produced == reference
    assert json.loads((out / f"{NO_ID}_summary.json").read_text())["split_keys"]["id"] == 0

    # the manifest lists exactly the good shards
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in manifest["shards"]] == [shard_plan.shard_name(p) for p in good]
    assert [e["name"] for e in manifest["excluded"]] == [CORRUPT]

    # the trainer reads the same samples from --data-manifest as from the prefixes given directly
    _same_samples(tmp_path, out / "manifest.json", [str(ref / shard_plan.shard_name(p)) for p in good])


def _same_samples(tmp_path, manifest: Path, prefixes: list[str]) -> None:
    from megatron_fixedcode.data import DataConfig, build_datasets, global_batch_indices
    from megatron_fixedcode.data.inspect import describe_samples
    from megatron_fixedcode.tokenizers import build_tokenizer
    from megatron_fixedcode.training.arguments import parse_pretrain_args, train_paths, valid_paths
    from tests.data_helpers import single_process_group

    tiny = ["--config", str(REPO / "examples" / "recipes" / "tiny_cpu.yaml"), "--dry-run",
            "--tokenizer-model", str(TOKENIZER)]
    from_manifest = parse_pretrain_args(tiny + ["--data-manifest", str(manifest)]).args
    direct = [p.replace(str(tmp_path / "ref"), str(manifest.parent)) for p in prefixes]
    train = [p + "_train_text_document" for p in direct]
    valid = [p + "_valid_text_document" for p in direct]
    valid = [v for v in valid if json.loads(Path(v.rsplit("_valid", 1)[0] + "_summary.json").read_text())["documents"]["valid"]]
    by_hand = parse_pretrain_args(tiny + ["--train-data-path", *train, "--valid-data-path", *valid]).args
    assert (from_manifest.train_data_path, from_manifest.valid_data_path) == (by_hand.train_data_path, by_hand.valid_data_path)
    tokenizer = build_tokenizer("HuggingFaceTokenizer", str(TOKENIZER))
    samples = []
    with single_process_group(tmp_path):
        for a in (from_manifest, by_hand):
            cfg = DataConfig(data_path=train_paths(a), valid_data_path=valid_paths(a), dataset_type=a.dataset_type,
                             seq_length=a.seq_length, split=a.split or "969, 30, 1", cache_path=str(tmp_path / "cache"))
            train_ds, valid_ds = build_datasets(cfg, tokenizer, num_train_samples=64, num_valid_samples=16, seed=3)
            samples.append([[r.token_ids for r in describe_samples(ds, global_batch_indices(step, 8))]
                            for ds, step in ((train_ds, 0), (train_ds, 5), (valid_ds, 1))])
    assert samples[0] == samples[1] and len(samples[0][0]) == 8

    # and a tiny training run (2 steps, validation at step 2) trains on them identically (both at once)
    runs = {}
    for name, flags in (("manifest", ["--data-manifest", str(manifest)]),
                        ("prefixes", ["--train-data-path", *train, "--valid-data-path", *valid])):
        cmd = [sys.executable, "-m", "megatron_fixedcode.pretrain", *tiny[:2], "--tokenizer-model", str(TOKENIZER),
               "--train-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--log-interval", "1",
               "--data-cache-path", str(tmp_path / f"cache-{name}"), "--metrics-file", str(tmp_path / f"{name}.jsonl"),
               *flags]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        runs[name] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    losses = []
    for name, proc in runs.items():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-4000:]
        records = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        losses.append([(r.get("step"), r.get("loss"), r.get("val_loss")) for r in records])
    assert losses[0] == losses[1] and any(v is not None for _, _, v in losses[0]) and len(losses[0]) >= 2
