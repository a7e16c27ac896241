"""Output folders that never lose what was there: refuse what attnlab did not write, replace by swap.

Every command with an output folder (``--out``) follows one rule, implemented here once:

- a missing or empty folder is simply written;
- a non-empty folder that is not the command's own kind of output (``is_own``) is refused in one
  line naming the folder and ``--overwrite``, unless ``overwrite`` is set;
- every folder written here records, last, its kind, its entries and each file's size and
  sha256 (the manifest, ``.attnlab-manifest.json``): its own kind of output is replaced only if
  it holds nothing else (a README, notes/, a run put there), or that is refused in one line
  naming them; no ``--out`` may lie inside such a folder, whose next replacement would take it
  along; and a reader checks its files against it (``check_manifest``);
- a replacement is written completely into a hidden sibling folder first and only then swapped
  in (old folder renamed aside, new one renamed into place, old one deleted), so a failure at
  any moment (disk full, Ctrl-C, a bug) leaves the previous output whole; should the process
  die between the two renames (SIGKILL, power loss), the next command writing there renames the
  old folder back first (``restore_interrupted_swap``);
- a full disk is reported as "no space left on device while writing OUT; nothing was lost".

Usage::

    with replace_folder(out, "model folder", overwrite=args.overwrite) as tmp:
        write_everything_into(tmp)
    # here ``out`` holds the new output; on an exception it holds exactly what it held before
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError


def check_name_lengths(out: Path, flag: str = "--out") -> None:
    """Refuse a path with a name longer than its file system takes (NAME_MAX, usually 255
    bytes), before anything is written: it failed mid-command with ENAMETOOLONG."""
    absolute = Path(os.path.abspath(out))
    folder = next(p for p in absolute.parents if os.path.isdir(p))  # the root always is
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no such limit
        return
    sizes = [len(os.fsencode(part)) for part in absolute.parts]
    if max(sizes) > limit:
        raise AttnlabError(
            f"{flag} {out}: a name of {max(sizes)} bytes, more than the {limit} its file system "
            f"allows; choose a shorter {flag}"
        )


def check_out_path(out: Path, flag: str = "--out") -> bool:
    """Refuse an ``out`` that cannot be a folder (a file, a symlink loop); True if it has content."""
    try:
        out.stat()
    except FileNotFoundError:
        if out.is_symlink():
            raise AttnlabError(f"{out} is a dangling symlink; choose another {flag}") from None
        return False
    except OSError as e:  # ELOOP (a symlink loop), ENOTDIR (a parent is a file), EACCES
        raise AttnlabError(f"{out}: {e.strerror}; choose another {flag}") from None
    if not out.is_dir():
        raise AttnlabError(f"{out} exists and is not a folder; choose another {flag}")
    return any(out.iterdir())


def check_writable(path: Path, flag: str = "--out") -> None:
    """Refuse, before any work, a path whose folder cannot be written (a file on the way, a
    read-only or pseudo file system such as /proc): the nearest existing folder must take a file
    (a nameless temporary one, gone at once)."""
    folder = next(p for p in [path, *path.parents] if p.exists())
    try:
        if not folder.is_dir():  # a file where a folder has to be
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise AttnlabError(f"cannot write {path} ({e.strerror}); choose another {flag}") from None


def holds_only(
    folder: Path, names: Iterable[str], folders: dict[str, Iterable[str]] | None = None
) -> bool:
    """Whether every entry of ``folder`` is a file named in ``names``, the manifest, or a
    subfolder named in ``folders`` holding only the files it names (what a writer may replace:
    a README, another subfolder or anything else a user put beside its files is not its to
    delete)."""
    allowed, folders = {*names, MANIFEST}, folders or {}
    return all(
        not p.is_symlink()
        and (
            (p.name in allowed and p.is_file())
            or (p.name in folders and p.is_dir() and holds_only(p, folders[p.name]))
        )
        for p in folder.iterdir()
    )


def _real_paths(source: Path) -> Iterator[Path]:
    """Where ``source`` really is, and where every symlink under it points (a Hugging Face cache
    folder is links into a blobs folder beside it)."""
    yield Path(os.path.realpath(source))  # realpath: no error on a symlink loop
    if source.is_dir():
        for root, dirs, files in os.walk(source):  # does not follow links to folders
            for name in dirs + files:
                if os.path.islink(os.path.join(root, name)):
                    yield Path(os.path.realpath(os.path.join(root, name)))


def refuse_source_inside(out: Path, sources: Iterable[str | Path], flag: str = "--out") -> None:
    """Refuse an ``out`` that is, or contains, a file or folder the command reads from (or one
    a symlink in it points to): replacing ``out`` would delete the command's own input, with
    --overwrite or without."""
    target = Path(os.path.realpath(out.expanduser()))
    for source in sources:
        for path in _real_paths(Path(source).expanduser()):
            if path == target or target in path.parents:
                raise AttnlabError(
                    f"{flag} {out} would replace the source {source}; choose another {flag}"
                )


# what replace_folder (or a folder format's own writer) wrote into a folder, written last:
# {"kind": its ``what``, "entries": [top-level names], "files": {path: {"bytes", "sha256"}}}
# plus what the format adds (a model folder: which weights; attnlab.train.checkpoint). A
# manifest of an older attnlab lists the names alone: read as before, with nothing to check.
MANIFEST = ".attnlab-manifest.json"
SHOWN = 5  # entries a refusal names before "and N more"
# files up to this size have their sha256 checked at every load; a larger one only when asked
# (verify) or when it changed after the manifest was written (its first use since)
SMALL_FILE = 1 << 20


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in blocks (a bin or an ONNX graph may not fit in memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, what: str, extra: dict[str, Any] | None = None) -> None:
    """Record the kind, the entries and every file's size and sha256 of ``folder`` (written
    last: the list is complete), with ``extra`` (what the folder's format adds)."""
    entries = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
    files = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    write_json(
        folder / MANIFEST, {"kind": what, "entries": entries, "files": files, **(extra or {})}
    )


def _parse_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at ``path`` if it is one (a kind, a list of names and, in a current one,
    each file's size and sha256), else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    valid = (
        isinstance(data, dict)
        and isinstance(data.get("kind"), str)
        and isinstance(data.get("entries"), list)
        and all(isinstance(e, str) for e in data["entries"])
    )
    files = data.get("files") if valid else None
    if files is not None:  # absent in an older manifest
        valid = isinstance(files, dict) and all(
            isinstance(f, dict)
            and isinstance(f.get("bytes"), int)
            and isinstance(f.get("sha256"), str)
            for f in files.values()
        )
    return data if valid else None


def read_manifest(folder: Path, flag: str = "--out") -> dict[str, Any] | None:
    """``folder``'s manifest, or None if it has none; a damaged one is refused in one line (it
    alone says what in the folder attnlab may delete)."""
    return _manifest_at(
        folder,
        f"what attnlab wrote in {folder} is unknown; pass --overwrite to replace the folder "
        f"whole, or choose another {flag}",
    )


def _manifest_at(folder: Path, if_damaged: str) -> dict[str, Any] | None:
    """``folder``'s parsed manifest, None without one; a damaged one refused: "damaged, so ..."."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    data = _parse_manifest(path)
    if data is None:
        raise AttnlabError(f"{path} is damaged, so {if_damaged}")
    return data


def check_manifest(folder: Path, full: bool = False) -> dict[str, Any] | None:
    """Refuse, in one line, a file of ``folder`` that is not the one its manifest records;
    return the manifest (None: the folder has none).

    Every listed file there must have its size; its sha256 is compared for a small file
    (SMALL_FILE), for one changed after the manifest was written, and with ``full`` for all.
    A listed file that is gone is refused only with ``full``: loading leaves it to the reader
    that needs it (an export's unused formats may be deleted). A damaged manifest is refused;
    one of an older attnlab (names only) has nothing to check.
    """
    data = _manifest_at(folder, f"what {folder} should hold is unknown; write the folder again")
    if data is None:
        return None
    path = folder / MANIFEST
    written = path.stat().st_mtime_ns
    fix = "restore it, or write the folder again"
    for name, recorded in (data.get("files") or {}).items():
        file = folder / name
        if not file.is_file():
            if full:
                raise AttnlabError(f"{file} is missing (listed in {path}); {fix}")
            continue
        stat = file.stat()
        if stat.st_size != recorded["bytes"]:
            raise AttnlabError(
                f"{file} has {stat.st_size:,} bytes where attnlab wrote {recorded['bytes']:,} "
                f"(cut, or replaced since: {path}); {fix}"
            )
        digest = full or stat.st_size <= SMALL_FILE or stat.st_mtime_ns > written
        if digest and file_sha256(file) != recorded["sha256"]:
            raise AttnlabError(
                f"{file} is not the file attnlab wrote there (its sha256 differs from {path}'s); "
                f"{fix}"
            )
    return data


def _listing(paths: list[Path]) -> str:
    """``README.md, notes/, thesis.txt`` (folders with a slash), at most SHOWN of them."""
    names = [f"{p.name}/" if p.is_dir() and not p.is_symlink() else p.name for p in paths]
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def refuse_nested(out: Path, flag: str = "--out") -> None:
    """Refuse an ``out`` inside a folder replace_folder wrote (a data or model folder): that
    folder's next replacement would delete it, and its manifest does not list it."""
    out = out.expanduser()
    for path in dict.fromkeys((Path(os.path.abspath(out)), Path(os.path.realpath(out)))):
        for folder in path.parents:
            if (folder / MANIFEST).is_file():
                manifest = _parse_manifest(folder / MANIFEST)
                kind = manifest["kind"] if manifest is not None else "folder"
                shown = folder if out.is_absolute() else os.path.relpath(folder)  # as given
                raise AttnlabError(
                    f"{flag} {out} is inside {shown}, a {kind} that attnlab replaces whole; "
                    f"choose another {flag}"
                )


def refuse_foreign(
    out: Path,
    what: str,
    overwrite: bool = False,
    is_own: Callable[[Path], bool] | None = None,
    flag: str = "--out",
    sources: Iterable[str | Path] = (),
) -> bool:
    """Raise unless ``out`` may be (re)written; return True when it holds something to replace.

    A non-empty ``out`` is this command's own output, which it may replace without
    ``--overwrite``, if its manifest is of kind ``what`` and lists everything it holds (else the
    rest is named in the refusal) and ``is_own(out)`` (its content is of that kind; None: no
    check); without a manifest (written before manifests, or not by attnlab) ``is_own(out)``
    alone decides (None: never). ``out`` may never be or contain one of ``sources``
    (refuse_source_inside), nor lie inside a folder with a manifest (refuse_nested). An ``out``
    that a killed process left mid-swap is first restored (``restore_interrupted_swap``).
    """
    check_name_lengths(out, flag)
    restore_interrupted_swap(out)
    full = check_out_path(out, flag)
    refuse_source_inside(out, sources, flag)
    refuse_nested(out, flag)
    if not full or overwrite:
        return out.exists()
    manifest = read_manifest(out, flag)
    if manifest is not None and manifest["kind"] == what:
        listed = {*manifest["entries"], MANIFEST}
        extra = sorted(p for p in out.iterdir() if p.name not in listed)
        if extra:
            raise AttnlabError(
                f"{out} holds {_listing(extra)}, which attnlab did not write there; move them "
                f"out, or pass --overwrite to delete them with the {what}"
            )
    # of this kind by its manifest (or, without one, by is_own), and what it holds still is
    # (is_own: a copied manifest proves nothing about files edited since)
    own_kind = manifest["kind"] == what if manifest is not None else is_own is not None
    if own_kind and (is_own is None or is_own(out)):
        return True
    kind = f" and is not a {what}" if is_own is not None or manifest is not None else ""
    raise AttnlabError(
        f"{out} is not empty{kind}; pass --overwrite to replace it, or choose another {flag}"
    )


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write; renamed onto ``path`` when the block ends
    without an error, removed otherwise, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")  # keeps the suffix writers infer from
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a no-op once renamed


def write_json(path: Path, data: Any) -> None:
    """Write JSON via a temporary file and rename, so readers never see half a file."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, default=str))


def disk_full(path: Path) -> bool:
    """Whether the file system of ``path`` has no space left."""
    try:
        return shutil.disk_usage(path).free == 0
    except OSError:
        return False


def out_of_space(e: BaseException, path: Path) -> bool:
    """Whether the failure ``e`` of a write under ``path`` is a full disk. Writers say so in
    their own ways: an OSError's ENOSPC, the tokenizers library a plain Exception naming
    "os error 28", numpy an errno-less OSError ("720002 requested and 524288 written"), torch a
    RuntimeError ("unexpected pos"), so a file system with nothing left also counts."""
    if isinstance(e, AttnlabError) or not isinstance(e, Exception):
        return False
    if getattr(e, "errno", None) == errno.ENOSPC or "os error 28" in str(e):
        return True
    return disk_full(path)


@contextlib.contextmanager
def full_disk_in_one_line(folder: Path) -> Iterator[None]:
    """Turn a full disk while writing under ``folder`` into its one-line AttnlabError. Only for
    writers that replace each file by rename (write_json, checkpoints, appended rows), so that
    what ``folder`` held is whole."""
    try:
        yield
    except Exception as e:
        if out_of_space(e, folder):
            raise AttnlabError(no_space_message(folder)) from e
        raise


def no_space_message(path: Path | str) -> str:
    """The one line a full disk gets while writing ``path``."""
    return f"no space left on device while writing {path}; nothing was lost"


def fsync(path: Path) -> None:
    """Flush a file (an error is real) or a folder's entries (some file systems cannot: skipped)."""
    folder = path.is_dir()
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not folder:
            raise


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder``, then the folders themselves, deepest first."""
    paths = sorted(folder.rglob("*"), key=lambda p: (p.is_dir(), -len(p.parts)))
    for path in [*paths, folder]:
        fsync(path)


def swap_in(
    new: Path, out: Path, aside: Path | None = None, between: Callable[[], None] | None = None
) -> None:
    """Put the complete folder ``new`` at ``out``; an existing ``out`` is deleted only afterwards.

    The old ``out`` waits at ``aside`` (default: a hidden name of this process and this swap, so a
    later process given the same PID never mistakes a dead one's aside for its own) while ``new``
    is renamed in. Should that rename fail or be interrupted (``between`` runs just before it: a
    test hook), the old folder is renamed back: ``out`` ends up holding the old folder or the
    new one, never neither. A fixed ``aside`` lets a reader find the old folder after a crash.
    """
    aside = aside or out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    moved = out.exists()
    if moved:
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(out, aside)
    try:
        if between is not None:
            between()
        os.replace(new, out)
    except BaseException:
        if moved and not out.exists():
            os.replace(aside, out)
        raise
    fsync(out.parent)  # make the renames themselves durable (power loss, not just a kill)
    shutil.rmtree(aside, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (POSIX). A PID no process can have counts as alive: nothing
    is removed on its account."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's process; no process at all
        return True
    return True


def _dead_siblings(out: Path, kind: str) -> list[Path]:
    """Hidden siblings ``.OUT.KIND-PID[-TOKEN]`` whose process no longer runs (POSIX only)."""
    if os.name != "posix":  # os.kill(pid, 0) asks nothing elsewhere
        return []
    prefix = f".{out.name}.{kind}-"
    found = []
    for path in out.parent.glob(f"{glob.escape(prefix)}*"):
        pid = path.name.removeprefix(prefix).partition("-")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            found.append(path)
    return found


def remove_stale_temps(out: Path) -> None:
    """Delete the temporary siblings ``.OUT.tmp-PID`` (see replace_folder) of processes that no
    longer run: a SIGKILL or power loss leaves them, hidden, as large as what they were writing.
    Never the ``.OUT.old-PID-TOKEN`` of swap_in: see ``restore_interrupted_swap``."""
    for path in _dead_siblings(out, "tmp"):
        shutil.rmtree(path, ignore_errors=True)


def restore_interrupted_swap(out: Path) -> None:
    """Rename the old folder back to a missing ``out`` when swap_in's process died mid-swap.

    Its aside ``.OUT.old-PID-TOKEN`` is then the only copy of what ``out`` held; putting it back
    makes the next command see ``out`` as it was (and refuse or replace it by the usual rules).
    With several such asides the most recently renamed one is ``out``'s last content.
    """
    if os.path.lexists(out):  # there, or a link; never raises (a name too long: checked next)
        return
    olds = _dead_siblings(out, "old")
    if olds:
        os.replace(max(olds, key=lambda p: p.stat().st_ctime), out)


@contextlib.contextmanager
def replace_folder(
    out: str | Path,
    what: str,
    overwrite: bool = False,
    is_own: Callable[[Path], bool] | None = None,
    flag: str = "--out",
    sources: Iterable[str | Path] = (),
    manifest: bool = True,
    describe: Callable[[Path], dict[str, Any]] | None = None,
) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``out`` to write into; swap it in when the block ends.

    Checks first (see ``refuse_foreign``), so nothing is written when ``out`` must be refused.
    If the block raises (or is interrupted) the temporary folder is removed and ``out`` is as it
    was; a full disk becomes one AttnlabError saying so. ``manifest=False`` writes none: a
    folder that changes after it is written (a run: resumes, analyses) would outgrow its list;
    ``describe(tmp)``: what the folder's format adds to it (a model folder: its weights).
    """
    out = Path(out).expanduser()
    if out.name in ("", ".."):  # "", "." or "..": a swap renames the folder, not the working one
        raise AttnlabError(f"{flag} {str(out)!r} must name a folder, not the current or parent one")
    refuse_foreign(out, what, overwrite, is_own, flag, sources)
    if out.is_symlink():  # the swap would replace the link, not the folder it points to
        raise AttnlabError(
            f"{out} is a symlink to {os.readlink(out)}; give that folder as {flag} instead"
        )
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    # the folders above ``out`` this creates, deepest first: removed again if nothing comes
    created = [p for p in out.absolute().parents if not os.path.lexists(p)]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:  # a read-only or pseudo file system (/proc), a permission
        if e.errno == errno.ENOSPC:
            raise AttnlabError(no_space_message(out)) from e
        raise AttnlabError(f"cannot write {out} ({e.strerror}); choose another {flag}") from None
    try:
        yield tmp
        if manifest:
            write_manifest(tmp, what, describe(tmp) if describe is not None else None)
        fsync_tree(tmp)
        swap_in(tmp, out)
    except Exception as e:
        if out_of_space(e, tmp):
            raise AttnlabError(no_space_message(out)) from e
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once swapped in
        for folder in created:
            with contextlib.suppress(OSError):  # not empty: ``out`` is in it now
                folder.rmdir()
