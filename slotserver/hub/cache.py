"""The Hugging Face hub cache, read as llama.cpp reads it (common/hf-cache.cpp, download.cpp).

    CACHE/models--USER--REPO/refs/main                 the snapshot's commit
    CACHE/models--USER--REPO/snapshots/COMMIT/*.gguf   files (symlinks to blobs/, or anywhere)

A model file `name-Q4_K_M.gguf` (first shard for split files) is listed as `USER/REPO:Q4_K_M`;
mmproj and draft sidecars are not models. `USER/REPO[:TAG]` resolves to the file whose name has
the tag; without a tag, Q4_K_M, then Q8_0, then the first model file: llama.cpp's choice (`pick`,
which download.py applies to a repository's listing too). Models get there with `serve -hf`
(download.py), `hf download` or llama-server's `-hf`. The cache folder is llama.cpp's: LLAMA_CACHE, HF_HUB_CACHE,
HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from slotserver.errors import ConfigError

SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")   # llama.cpp's gguf_filename_is_model
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


@dataclass(frozen=True)
class CachedFile:
    repo: str        # USER/REPO
    rel: str         # path inside the snapshot
    path: Path       # as found in the snapshot (not resolved: two ids may share one blob)

    def split(self) -> tuple[str, str, int]:
        """-> (prefix, TAG upper-cased or "", shard index), llama.cpp's get_gguf_split_info."""
        return split_info(self.rel)[:3]

    @property
    def is_model(self) -> bool:
        prefix, _, index = self.split()
        return index == 1 and not any(s in prefix for s in SIDECARS)


def split_info(rel: str) -> tuple[str, str, int, int]:
    """A GGUF path -> (prefix, TAG upper-cased or "", shard index, shard count): llama.cpp's
    get_gguf_split_info (`NAME-Q4_K_M-00002-of-00003.gguf`: NAME-Q4_K_M, Q4_K_M, 2, 3)."""
    prefix, index, count = rel.removesuffix(".gguf"), 1, 1
    if m := SPLIT.match(prefix):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    tag = m.group(1).upper() if (m := TAG.search(prefix)) else ""
    return prefix, tag, index, count


def part_name(prefix: str, index: int, count: int) -> str:
    """Part `index` (1-based) of `count` of a split GGUF: llama.cpp's llama_split_path."""
    return f"{prefix}-{index:05d}-of-{count:05d}.gguf"


def part_names(rel: str) -> list[str]:
    """Every part's name of the split GGUF `rel` is a part of, first to last ([rel] for a whole file)."""
    prefix, _, _, count = split_info(rel)
    return [part_name(prefix, i, count) for i in range(1, count + 1)] if count > 1 else [rel]


def split_parts(names: list[str], name: str) -> tuple[list[str], list[int]]:
    """The parts of the split GGUF `name` belongs to among a repository's `names`, first to last
    (llama.cpp's get_split_files; [name] for a whole file) -> (parts, the numbers of parts missing)."""
    prefix, _, _, count = split_info(name)
    if count <= 1:
        return [name], []
    found = {info[2]: n for n in names if (info := split_info(n))[0] == prefix and info[3] == count}
    return [found[i] for i in sorted(found)], [i for i in range(1, count + 1) if i not in found]


def default_cache() -> Path | None:
    for var, sub in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""),
                     ("HF_HOME", "hub"), ("XDG_CACHE_HOME", "huggingface/hub")):
        if os.environ.get(var):
            return Path(os.environ[var]) / sub
    return Path.home() / ".cache" / "huggingface" / "hub"


def _commit(repo_dir: Path) -> str | None:
    refs = repo_dir / "refs"
    found = [f for f in sorted(refs.iterdir()) if f.is_file()] if refs.is_dir() else []
    for ref in sorted(found, key=lambda f: f.name != "main"):   # main first, then any other ref
        commit = ref.read_text(encoding="utf-8", errors="replace").strip()
        if commit and (repo_dir / "snapshots" / commit).is_dir():
            return commit
    return None


def cached_files(cache: Path, repo: str | None = None) -> list[CachedFile]:
    out: list[CachedFile] = []
    if not cache.is_dir():
        return out
    for repo_dir in sorted(cache.glob("models--*")):
        name = repo_dir.name[len("models--"):].replace("--", "/")
        if (repo is not None and name != repo) or (commit := _commit(repo_dir)) is None:
            continue
        snapshot = repo_dir / "snapshots" / commit
        out += [CachedFile(name, p.relative_to(snapshot).as_posix(), p) for p in sorted(snapshot.rglob("*.gguf"))]
    return out


def list_models(cache: Path) -> dict[str, Path]:
    """{USER/REPO:TAG: file} for every model file in the cache (a split one with all its parts)."""
    out: dict[str, Path] = {}
    files = cached_files(cache)
    rels = {(f.repo, f.rel) for f in files}
    for f in files:
        _, tag, _ = f.split()
        if f.is_model and tag and _whole(f.rel, {r for repo, r in rels if repo == f.repo}):
            out.setdefault(f"{f.repo}:{tag}", f.path)
    return out


def _whole(rel: str, rels: set[str]) -> bool:
    """Whether every part of the split GGUF `rel` is among `rels` (a whole file: yes). A download
    stopped between parts leaves a first part that would not load."""
    return all(part in rels for part in part_names(rel))


def pick(names: list[str], tag: str) -> str | None:
    """The model file of a repository's GGUF paths that `USER/REPO:TAG` names (tag "": llama.cpp's
    default choice); None if none fits."""
    models = [n for n in names if n.endswith(".gguf") and CachedFile("", n, Path(n)).is_model]
    for t in ([tag] if tag else list(DEFAULT_TAGS)):
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        if hit := [n for n in models if pattern.search(n)]:
            return hit[0]
    return None if tag or not models else models[0]


def resolve(cache: Path | None, ref: str, file: str | None = None) -> Path:
    """`USER/REPO[:TAG]` (or one file of it) -> its cached path; ConfigError naming what is missing."""
    repo, _, tag = ref.partition(":")
    files = {f.rel: f for f in (cached_files(cache, repo) if cache is not None else [])}
    files = {rel: f for rel, f in files.items() if _whole(rel, set(files))}
    name = file if file in files else None if file else pick(list(files), tag)
    if name is None:
        raise ConfigError(f"'{ref}{'/' + file if file else ''}' is not in the models cache "
                          f"({cache or 'none'})")
    return files[name].path


def remove(cache: Path, ref: str) -> bool:
    """Delete `USER/REPO[:TAG]` from the cache, as llama.cpp's common_download_remove: with a tag the
    snapshot files of that tag (every shard) and the blobs they point to; without one the whole
    repository. -> whether anything was deleted."""
    repo, _, tag = ref.partition(":")
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    if not tag:
        existed = repo_dir.is_dir()
        shutil.rmtree(repo_dir, ignore_errors=True)
        return existed
    gone = [f.path for f in cached_files(cache, repo) if f.split()[1] == tag.upper()]
    blobs = {p.resolve() for p in gone if p.is_symlink()}
    for path in gone:
        path.unlink(missing_ok=True)
    still = {p.resolve() for p in (repo_dir / "snapshots").rglob("*") if p.is_symlink()}
    for blob in blobs - still:   # a blob another snapshot still links to stays
        if blob.parent == (repo_dir / "blobs").resolve():
            blob.unlink(missing_ok=True)
    return bool(gone)


def remove_partial(cache: Path, repo: str, since: float) -> None:
    """The repository's partial downloads (huggingface_hub's `blobs/*.incomplete`) written since
    `since` (a time.time()): a cancelled download deleted (router/downloads.py) leaves no bytes
    behind, while another quant's partial file, kept by an earlier cancel, stays resumable."""
    for part in (cache / ("models--" + repo.replace("/", "--")) / "blobs").glob("*.incomplete"):
        try:
            if part.stat().st_mtime >= since - 1:
                part.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
