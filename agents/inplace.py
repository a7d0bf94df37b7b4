"""Files a node already has, registered as a data set where they lie (``gsched data add``).

Who calls: the agent's data server, for ``POST /scan/<dataset>`` (:func:`find_files`, then
:func:`hash_files`) and ``POST /link/<dataset>/<index>`` (:func:`link_shard`).  A file becomes a
shard whatever its type: once the server has stored the manifest, the file is *hard-linked* as the
shard's usual path ``DIR/<dataset>/<index:05d>.shard``, so the inventory, the data server, staging and
the rank's reader see it like any other shard, no byte is copied, and the user's own file name stays
as it was (dropping the replica later unlinks the shard's name only).

Every refusal is an :class:`InPlaceError` naming the node and the file or folder: a path outside the
data dir, a symlink out of it, a glob that matches nothing, a path the node lacks, a file that changed
while it was hashed, a shard name already holding other bytes.  Nothing is written before a refusal,
and nothing already stored is replaced.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.shardfile import SHARD_SUFFIX, shard_path

CHUNK = 1 << 20
Progress = Callable[[str, int, int], None]  # (file, bytes done in it, its size)


class InPlaceError(ValueError):
    """A registration a node refuses; ``status`` is the HTTP status its data server answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Found:
    """A file to register: ``path`` (real, inside the data dir), ``rel`` (below the folder given),
    ``data_rel`` (below the data dir)."""

    path: Path
    rel: str
    data_rel: str


def _within(root: Path, path: Path) -> bool:
    return path == root or root in path.parents


def _skipped(rel_to_data: Path) -> bool:
    """gsched's own files: its state folder, shard files and partial transfers."""
    parts = rel_to_data.parts
    name = rel_to_data.name
    return (bool(parts) and parts[0] == ".gsched") or (name.endswith(SHARD_SUFFIX) and name[:-len(SHARD_SUFFIX)].isdigit()) \
        or ".part" in name or ".fetch" in name


def find_files(data_dir: Path, node: str, path: str, glob: str = "*") -> list[Found]:
    """The files under ``path`` (relative to the data dir, or absolute inside it) whose path below it
    matches ``glob`` (fnmatch; ``*`` also crosses ``/``), sorted; ``path`` may also be one file.

    Raises InPlaceError: 403 for a path outside the data dir or a symlink out of it (naming it), 404 for a
    path this node lacks, 422 for a glob that matches nothing."""
    root = data_dir.resolve()
    given = Path(path)
    target = given if given.is_absolute() else root / given
    if not _within(root, Path(os.path.normpath(target))):
        raise InPlaceError(403, f"node {node}: {path} is outside its data dir {root}")
    if not os.path.lexists(target):
        raise InPlaceError(404, f"node {node} has no {path} (under its data dir {root})")
    real = target.resolve()
    if not _within(root, real):
        raise InPlaceError(403, f"node {node}: {path} is a symlink out of its data dir {root} (to {real})")
    if real.is_file():
        candidates = [(real, real.name)]
    else:
        candidates = []
        for dirpath, dirnames, filenames in os.walk(real, followlinks=False):
            here = Path(dirpath)
            for d in list(dirnames):
                if (here / d).is_symlink() and not _within(root, (here / d).resolve()):
                    raise InPlaceError(403, f"node {node}: {here / d} is a symlink out of its data dir {root}")
            dirnames.sort()
            for f in sorted(filenames):
                candidates.append((here / f, str((here / f).relative_to(real))))
    out: list[Found] = []
    for file, rel in candidates:
        if not fnmatch.fnmatch(rel, glob):
            continue
        resolved = file.resolve()
        if not _within(root, resolved):
            raise InPlaceError(403, f"node {node}: {file} is a symlink out of its data dir {root} (to {resolved})")
        data_rel = resolved.relative_to(root)
        if _skipped(data_rel) or not resolved.is_file():
            continue
        out.append(Found(resolved, rel, str(data_rel)))
    if not out:
        raise InPlaceError(422, f"node {node}: no file under {path} matches {glob!r}")
    return out


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def hash_file(node: str, path: Path, progress: Progress | None = None, label: str = "") -> tuple[str, os.stat_result]:
    """Streaming sha256 of ``path``; raises InPlaceError 409 when it changed while it was read (size,
    time or inode differ before and after, or it is gone)."""
    name = label or str(path)
    digest = hashlib.sha256()
    try:
        before = path.stat()
        done = 0
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
                done += len(block)
                if progress:
                    progress(name, done, before.st_size)
        after = path.stat()
    except FileNotFoundError:
        raise InPlaceError(409, f"node {node}: {name} disappeared while it was hashed") from None
    except OSError as e:
        raise InPlaceError(422, f"node {node}: cannot read {name}: {e}") from None
    if _identity(before) != _identity(after) or done != after.st_size:
        raise InPlaceError(409, f"node {node}: {name} changed while it was hashed; register it once it is written")
    return digest.hexdigest(), after


def describe(path: Path) -> dict[str, Any]:
    """What the reader will find in a file: for a WebDataset tar (``KEY.cls`` members) its samples and
    the labels it uses; for anything else ``samples`` 0 (unknown) and no labels."""
    try:
        if not tarfile.is_tarfile(path):
            return {"format": "file", "samples": 0, "labels": []}
        labels: set[int] = set()
        samples = 0
        with tarfile.open(path, "r:") as tar:
            for m in tar:
                if m.isfile() and m.name.endswith(".cls"):
                    f = tar.extractfile(m)
                    text = f.read(32).decode("ascii", "replace").strip() if f else ""
                    if text.lstrip("-").isdigit():
                        labels.add(int(text))
                        samples += 1
        return {"format": "wds", "samples": samples, "labels": sorted(labels)}
    except (OSError, tarfile.TarError):
        return {"format": "file", "samples": 0, "labels": []}


def link_shard(data_dir: Path, node: str, data_rel: str, dataset: str, index: int, sha256: str,
               known: Callable[[Path, os.stat_result], str | None] | None = None) -> Path:
    """Hard-link the file ``data_rel`` (below the data dir) as shard ``index`` of ``dataset``; idempotent.

    The file must still hash to ``sha256`` (``known(path, stat)`` may answer from the scan's hash when the
    file is unchanged).  A shard path already holding these bytes is kept; one holding other bytes is
    refused (409), as is a file on another file system than the shard's folder (422)."""
    found = find_files(data_dir, node, data_rel, "*")
    if len(found) != 1 or found[0].data_rel != str(Path(os.path.normpath(data_rel))):
        raise InPlaceError(422, f"node {node}: {data_rel} is not one file")
    src = found[0].path
    st = src.stat()
    sha = (known(src, st) if known else None) or hash_file(node, src)[0]
    if sha != sha256:
        raise InPlaceError(409, f"node {node}: {data_rel} no longer has the bytes registered (sha256 {sha[:12]})")
    dest = shard_path(data_dir, dataset, index)
    if dest.exists():
        if os.path.samefile(dest, src):
            return dest
        raise InPlaceError(409, f"node {node}: {dest} already holds other bytes; nothing was changed")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError as e:
        raise InPlaceError(422, f"node {node}: cannot link {data_rel} as {dest.name} (it must be on the file system "
                                f"of the data dir's {dataset}/ folder): {e}") from None
    return dest
