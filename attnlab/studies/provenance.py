"""What a study was made from: package versions, its data folders (meta.json, the bins'
sha256 and the unigram loss, the floor a run that trains at all goes below) and the code state (commit, dirty tree, diff hash) each of its runs trained at, read
from the runs' env.json; and the refusal to mix runs of different code states."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.data.prepare import read_meta
from attnlab.data.token_files import read_tokens, unigram_loss
from attnlab.errors import AttnlabError
from attnlab.rundir import RunDir

BINS = ("train.bin", "val.bin")
_HASH_CHUNK = 1 << 20


def packages() -> dict[str, str]:
    """Python's version and those of attnlab and every installed package it requires."""
    versions = {"python": platform.python_version()}
    requires = importlib.metadata.requires("attnlab") or []
    names = ["attnlab"] + [
        match.group(0)
        for req in requires
        if "extra ==" not in req and (match := re.match(r"[A-Za-z0-9_.-]+", req))
    ]
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # a marker that does not apply here
            continue
    return versions


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def data_provenance(folders: Iterable[str], known: dict[str, Any]) -> dict[str, Any]:
    """Per prepared data folder: its meta.json, each bin's size and sha256, and the unigram loss
    (val tokens under train token frequencies; None where the bins cannot be read).

    A bin's hash (and the unigram loss) is taken from ``known`` (an earlier study.json's record) while its size and
    mtime are those recorded there, so a resumed study does not hash gigabytes again. A folder
    that is gone keeps its earlier record.
    """
    out: dict[str, Any] = {}
    for folder in sorted(set(folders)):
        path, before = Path(folder), known.get(folder, {})
        try:
            meta = read_meta(path)
        except AttnlabError:
            if before:
                out[folder] = before
            continue
        bins = {}
        for name in BINS:
            try:
                st = (path / name).stat()
            except OSError:
                continue
            old = before.get("bins", {}).get(name, {})
            same = old.get("bytes") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
            sha = old["sha256"] if same and old.get("sha256") else _sha256(path / name)
            bins[name] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
        unigram = before.get("unigram_loss") if bins == before.get("bins") else None
        out[folder] = {
            "meta": meta,
            "bins": bins,
            "unigram_loss": unigram if unigram is not None else _unigram(path, meta),
        }
    return out


def as_recorded(known: dict[str, Any]) -> dict[str, Any]:
    """The data record of a study reported again: as it ran. A folder still there with the same
    bins (by sha256) adds what an earlier attnlab did not record (the unigram loss); one
    prepared again since, or gone, changes nothing: the runs trained on the recorded data."""
    now = data_provenance(known, known)
    out = {}
    for folder, record in known.items():
        current = now.get(folder, {})
        digests = [
            {n: b.get("sha256") for n, b in r.get("bins", {}).items()} for r in (record, current)
        ]
        out[folder] = {**current, **record} if digests[0] == digests[1] else record
    return out


def _unigram(folder: Path, meta: dict[str, Any]) -> float | None:
    try:
        train, val = (read_tokens(folder / name, meta["dtype"]) for name in BINS)
        return unigram_loss(train, val, int(meta["vocab_size"]))
    except (AttnlabError, OSError, KeyError, TypeError, ValueError):
        return None


def code_state(env: dict[str, Any]) -> tuple[str | None, bool | None, str | None]:
    """(commit, dirty, diff sha256) of an env.json (or a resume of one); dirty is None where
    an earlier attnlab did not record it."""
    return env.get("git_commit"), env.get("git_dirty"), env.get("git_diff_sha256")


def describe_state(state: tuple[str | None, bool | None, str | None]) -> str:
    """A code state in a few words: "8e8a0c293cf6", "8e8a0c293cf6 + diff c7e40ae48a7d"."""
    commit, dirty, diff = state
    name = commit[:12] if commit else "an unknown commit"
    if dirty is None:
        return f"{name} (tree state not recorded)"
    return f"{name} + uncommitted diff {str(diff)[:12]}" if dirty else name


def run_states(run_dir: str | Path) -> list[tuple[str | None, bool | None, str | None]]:
    """The code states a run trained at: its first start's and each resume's (env.json)."""
    env = RunDir(run_dir).read_env()
    if env is None:
        return []
    resumes = env.get("resumes")
    later = [r for r in resumes if isinstance(r, dict)] if isinstance(resumes, list) else []
    return list(dict.fromkeys([code_state(env), *(code_state(r) for r in later)]))


def group_states(runs: dict[tuple[str, int], list[tuple]]) -> list[dict[str, Any]]:
    """``{(variant, seed): its code states}`` as one entry per code state, naming its runs."""
    groups: dict[tuple, dict[str, list[int]]] = {}
    for (variant, seed), states in runs.items():
        for state in states:
            groups.setdefault(tuple(state), {}).setdefault(variant, []).append(seed)
    return [
        {
            "commit": s[0],
            "dirty": s[1],
            "diff_sha256": s[2],
            "runs": [
                f"{v} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))}"
                for v, seeds in variants.items()
            ],
        }
        for s, variants in groups.items()
    ]


def refuse_mixed(groups: list[dict[str, Any]], hint: str = "") -> None:
    """Refuse, in one line naming each state and its runs, runs of more than one code state;
    ``hint`` ends the line (another way out)."""
    if len(groups) < 2:
        return
    named = "; ".join(
        f"{describe_state((g['commit'], g['dirty'], g['diff_sha256']))}: {', '.join(g['runs'])}"
        for g in groups
    )
    raise AttnlabError(
        f"this study would mix runs made at {len(groups)} code states ({named}); "
        f"pass --allow-mixed-commits to report them together, or use another --out{hint}"
    )
