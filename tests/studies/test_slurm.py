"""`attnlab study --executor slurm` against a real one-node SLURM (slurmctld, slurmd and munged
started here on loopback): the same results as a local study, a cancelled job retried and its
run resumed, a stopped study command rerun without submitting anything again.

The cluster tests are slow (each job starts Python and torch) and need Debian's slurm-wlm and
munge (`make test-slurm` installs them); they skip, saying why, where the daemons cannot start.
"""

from __future__ import annotations

import contextlib
import csv
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from test_folder_safety import snapshot

from attnlab.errors import AttnlabError
from attnlab.studies.executors import CONFIG_ENV, SlurmOptions, slurm_options
from attnlab.studies.output import StudyDir
from attnlab.studies.runner import run_study
from attnlab.studies.spec import load_spec

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
SBIN = os.pathsep.join(["/usr/sbin", "/sbin", os.environ.get("PATH", "")])
NODE_CPUS = 2  # few: the node shares this machine with everything else
# losses and counts must match to the bit; the run folder and times differ by nature
COMPARED = ("variant", "seed", "val_loss", "best_val_loss", "iters", "params", "status")
FAST = SlurmOptions(time=10, cpus=1, jobs=NODE_CPUS, retries=2, poll=0.5)

TWO_ARMS = """
name = "two-arms"
description = "vanilla against K/V-bias, tiny, for the SLURM tests"
[variants.base]
preset = "shakespeare-char"
[variants.kv]
preset = "kv-bias-shakespeare-char"
model = { n_embd = 24 }
[[comparisons]]
baseline = "base"
variant = "kv"
[scale.ci]
seeds = 2
model = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""

# one run, long enough to be cancelled after its first checkpoint (at iteration 10)
LONG = TWO_ARMS.replace("seeds = 2", "seeds = 1").replace(
    "max_iters = 4, eval_interval = 2", "max_iters = 100, eval_interval = 10"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(*args: str, check: bool = True) -> str:
    return subprocess.run(
        args, capture_output=True, text=True, check=check, timeout=60, env={**os.environ}
    ).stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """A one-node SLURM cluster on loopback for this session (its slurm.conf's path), its
    daemons stopped and its folder removed at the end; skipped, saying why, where it cannot
    start. Its folder is its own, not pytest's (which a concurrent pytest may prune)."""
    pytest.importorskip("submitit", reason="submitit is not installed (the cluster extra)")
    missing = [t for t in DAEMONS + CLIENTS if shutil.which(t, path=SBIN) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): make test-slurm")
    root = Path(tempfile.mkdtemp(prefix="attnlab-slurm-"))
    (root / "state").mkdir()
    (root / "spool").mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock, user = root / "munge.sock", getpass.getuser()
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=attnlabtest",
                "SlurmctldHost=localhost(127.0.0.1)",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                f"SlurmUser={user}",
                f"SlurmdUser={user}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={sock}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'slurmd.log'}",
                # no cgroups in a container: processes tracked by their parents, no binding
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "SchedulerParameters=sched_interval=1",
                "SlurmdParameters=config_overrides",
                "ReturnToService=2",
                "MpiDefault=none",
                "KillWait=2",  # a cancelled job's step is killed 2 s after its SIGTERM
                f"NodeName=attnlab-test NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 "
                f"CPUs={NODE_CPUS} RealMemory=2000 State=UNKNOWN",
                "PartitionName=test Nodes=attnlab-test Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH")}
    os.environ.update(SLURM_CONF=str(conf), PATH=SBIN)
    started = []
    try:
        for command in (
            ["munged", "--force", f"--socket={sock}", f"--key-file={key}"]
            + [f"--{f}-file={root / ('munged.' + f)}" for f in ("log", "pid", "seed")],
            ["slurmctld", "-f", str(conf)],
            ["slurmd", "-f", str(conf), "-N", "attnlab-test"],
        ):
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                pytest.skip(f"{command[0]} did not start: {done.stderr.strip()[-300:]}")
            started.append(command[0])
        deadline = time.monotonic() + 60
        while _sh("sinfo", "-h", "-o", "%T", check=False).strip() != "idle":
            if time.monotonic() > deadline:
                logs = [(root / n).read_text()[-300:] for n in ("slurmctld.log", "slurmd.log")]
                pytest.skip(f"the SLURM node never became idle: {' | '.join(logs)}")
            time.sleep(0.5)
        yield conf
    finally:
        if "slurmd" in started:
            _sh("scancel", f"--user={user}", check=False)
            deadline = time.monotonic() + 30
            while _sh("squeue", "-h", check=False).strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):  # each by the PID it recorded
            pid_file = root / f"{name}.pid"
            if name in started and pid_file.is_file():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    pid = int(pid_file.read_text().split()[0])
                    os.kill(pid, signal.SIGTERM)
                    deadline = time.monotonic() + 10  # it saves its state as it stops
                    while _running(pid) and time.monotonic() < deadline:
                        time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie no reaper collected has stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _local_study(text: str, tmp_path: Path, data: Path, **how: Any) -> tuple[Path, Path]:
    """The spec ``text`` as a file, and the study folder of it run here (the reference)."""
    spec_file, local = tmp_path / "spec.toml", tmp_path / "local"
    spec_file.write_text(text)
    run_study(load_spec(str(spec_file)), "ci", local, data=data, **how)
    return spec_file, local


def _rows(out: Path) -> list[tuple]:
    with (out / "results.csv").open() as f:
        return sorted(tuple(row[k] for k in COMPARED) for row in csv.DictReader(f))


def _jobs_of(out: Path) -> set[str]:
    """The ids of every job the controller knows (finished ones too) that ``out``'s study
    submitted, by its job name."""
    ids = set()
    for line in _sh("scontrol", "-o", "show", "jobs", check=False).splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("JobName") == f"attnlab-{out.resolve().name}":
            array = fields.get("ArrayJobId")
            ids.add(f"{array}_{fields['ArrayTaskId']}" if array else fields["JobId"])
    return ids


@pytest.mark.slow
def test_a_stopped_slurm_study_rerun_submits_nothing_again_and_equals_the_local_one(
    slurm_cluster: Path, tiny_data: Path, tmp_path: Path
) -> None:
    spec_file, local = _local_study(TWO_ARMS, tmp_path, tiny_data)
    spec = load_spec(str(spec_file))
    out = tmp_path / "stopped-and-rerun"
    command = [sys.executable, "-m", "attnlab", "study", str(spec_file), "--out", str(out)]
    command += ["--data", str(tiny_data), "--executor", "slurm", "--jobs", "2", "--time", "10"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), CONFIG_ENV: str(tmp_path / "slurm.toml")}
    (tmp_path / "slurm.toml").write_text("poll = 0.5\nretries = 1\n")
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        jobs_json = out / "slurm" / "jobs.json"
        deadline = time.monotonic() + 120
        while not jobs_json.is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        first.send_signal(signal.SIGINT)  # stopped while its jobs are queued or running
        said, err = (s.decode() for s in first.communicate(timeout=60))
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, said + err
    submitted = json.loads(jobs_json.read_text())
    assert len(submitted) == 4 and len({r["job"].split("_")[0] for r in submitted.values()}) == 1
    assert "SLURM: submitted 4 jobs" in said
    assert "SLURM: stopped following 4 jobs, which go on" in said
    lines: list[str] = []
    result = run_study(spec, "ci", out, data=tiny_data, jobs=2, slurm=FAST, progress=lines.append)
    assert (
        f"SLURM: following 4 jobs submitted earlier ({', '.join(r['job'] for r in submitted.values())})"
        in lines
    )
    assert not any("submitted" in line and "earlier" not in line for line in lines)
    assert _jobs_of(out) == {r["job"] for r in submitted.values()}  # nothing submitted again
    assert {k: v["job"] for k, v in StudyDir(out).read_jobs().items()} == {
        k: v["job"] for k, v in submitted.items()
    }
    assert [r["status"] for r in result["runs"]] == ["ok"] * 4
    assert _rows(out) == _rows(local)  # the losses bit for bit, through CSV's repr
    assert (out / "report.md").is_file()


@pytest.mark.slow
def test_a_cancelled_slurm_job_is_retried_and_its_run_resumes_identically(
    slurm_cluster: Path, tiny_data: Path, tmp_path: Path
) -> None:
    spec_file, local = _local_study(LONG, tmp_path, tiny_data, variants=["base"])
    spec = load_spec(str(spec_file))
    out = tmp_path / "cancelled"
    lines: list[str] = []
    errors: list[BaseException] = []

    def study() -> None:
        try:
            run_study(
                spec,
                "ci",
                out,
                data=tiny_data,
                variants=["base"],
                slurm=FAST,
                progress=lines.append,
            )
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    worker = threading.Thread(target=study)
    worker.start()
    run = out / "runs" / "base" / "seed0"
    deadline = time.monotonic() + 180
    while not (run / "latest").is_dir() and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    (first,) = (r["job"] for r in StudyDir(out).read_jobs().values())
    _sh("scancel", first)
    worker.join(timeout=300)
    assert not worker.is_alive() and not errors, errors
    said = f"SLURM job {first} (base seed 0) ended CANCELLED without its result; submitted again"
    assert any(line.startswith(said) and "(retry 1 of 2)" in line for line in lines), lines
    env = json.loads((run / "env.json").read_text())
    assert len(env.get("resumes", [])) == 1  # resumed from its checkpoint, not started again
    assert _rows(out) == _rows(local)


def test_slurm_options_come_from_the_config_file_under_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "slurm.toml"
    config.write_text(
        'partition = "gpu"\ntime = 240\ncpus = 8\njobs = 4\n'
        'setup = ["module load cuda"]\n[sbatch]\naccount = "lab"\n'
    )
    monkeypatch.setenv(CONFIG_ENV, str(config))
    options = slurm_options({"cpus": 2, "gpus": None, "sbatch": {"qos": "high"}})
    assert options == SlurmOptions(
        partition="gpu",
        time=240,
        cpus=2,
        jobs=4,
        setup=("module load cuda",),
        sbatch={"account": "lab", "qos": "high"},
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    monkeypatch.delenv(CONFIG_ENV)
    assert slurm_options({}) == SlurmOptions()  # no file: the defaults


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("partitions = 'a'", "unknown key 'partitions'; the keys are partition, time,"),
        ("time = '1:00:00'", "time is '1:00:00'; give a whole number"),
        ("cpus = 0", "cpus is 0; give at least 1"),
        ("retries = -1", "retries is -1; give at least 0"),
        ("sbatch = { account = 3 }", "give a table of sbatch options (KEY = VALUE)"),
        ("time = ", "cannot read the SLURM config"),
    ],
)
def test_a_bad_slurm_config_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, said: str
) -> None:
    config = tmp_path / "slurm.toml"
    config.write_text(text + "\n")
    monkeypatch.setenv(CONFIG_ENV, str(config))
    with pytest.raises(AttnlabError, match=None) as e:
        slurm_options({})
    assert said in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--partition", "gpu"], "--partition is an option of --executor slurm; leave it out"),
        (["--executor", "slurm", "--cpus", "0"], "--cpus is 0; give at least 1"),
        (["--executor", "slurm", "--sbatch", "=x"], "--sbatch '=x': give KEY=VALUE"),
        (["--executor", "slurm", "--plan"], "--plan times the runs on this machine; leave out"),
        (["--executor", "slurm"], "--executor slurm: sbatch is not on PATH"),
    ],
)
def test_slurm_options_refused_before_anything_is_written(
    tmp_path: Path,
    tiny_data: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    args: list[str],
    said: str,
) -> None:
    from attnlab.cli import main

    spec_file = tmp_path / "two-arms.toml"
    spec_file.write_text(TWO_ARMS)
    out = tmp_path / "out"
    bare = tmp_path / "bin"  # a PATH with git (the study records its commit) and no SLURM
    bare.mkdir()
    (bare / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    code = main(["study", str(spec_file), "--out", str(out), "--data", str(tiny_data), *args])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"attnlab study: error: {said}")
    assert snapshot(out) == {}


def test_the_eta_divides_by_the_runs_left_when_fewer_than_run_at_once() -> None:
    """16 SLURM jobs at once and 2 runs left: those 2 take one run's length, not an eighth."""
    from attnlab.studies.progress import Tracker

    lines: list[str] = []
    tracker = Tracker(4, lines.append, parallel=16)
    tracker.done("a seed 0", "done", 60.0)
    tracker.done("a seed 1", "done", 120.0)
    assert lines[-1] == "[2/4] a seed 1: done (2 min 00 s); 2 left, ETA 1 min 30 s"  # 90 s x 2 / 2


def test_a_unit_whose_retries_are_spent_stops_the_study_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue stands in here (every job gone at once, FAILED): the retries, the records
    and the refusal, without a cluster."""
    pytest.importorskip("submitit", reason="submitit is not installed (the cluster extra)")
    from attnlab.studies import executors

    folder = StudyDir(tmp_path / "study")
    submitted: list[str] = []

    def submit(self, work, items) -> list[str]:
        submitted.extend(f"{100 + len(submitted) + i}" for i in range(len(items)))
        return submitted[-len(items) :]

    monkeypatch.setattr(executors.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(executors.SlurmExecutor, "_submit", submit)
    monkeypatch.setattr(executors, "_queue", dict)
    monkeypatch.setattr(executors, "_final_state", lambda job: "FAILED")
    lines: list[str] = []
    options = SlurmOptions(retries=1, poll=0.001)
    slurm = executors.SlurmExecutor(options, folder, lines.append)
    with pytest.raises(AttnlabError) as e:
        slurm.run(str, ["x"], lambda *_: pytest.fail("no job returned"))
    assert str(e.value) == (
        "SLURM job 101 (str) ended FAILED without its result after 2 submissions; logs in "
        f"{folder.slurm}; the other results are in the study folder, and the same command "
        "submits it again"
    )
    assert lines == [
        f"SLURM: submitted 1 jobs (job 100, at most 16 at once); their logs are in {folder.slurm}",
        "SLURM: 0 queued, 0 running, 0 of 1 done",
        "SLURM job 100 (str) ended FAILED without its result; submitted again as job 101 "
        "(retry 1 of 1)",
        "SLURM job 101 (str) ended FAILED; no retries left (1)",
    ]
    (record,) = folder.read_jobs().values()
    assert record == {"job": "101", "label": "str", "attempt": 2, "collected": True}
    with pytest.raises(AttnlabError):  # given up: a rerun submits it afresh, not follows it
        slurm.run(str, ["x"], lambda *_: None)
    assert submitted == ["100", "101", "102", "103"]
