"""`-hf USER/REPO[:QUANT]` (and `-hff FILE`, `-hft TOKEN`, `--offline`): a model from the Hugging
Face hub, as llama-server gets it (common/download.cpp).

The repository's file list picks the model (cache.py `pick`: the file named by the quant tag,
case-insensitive; without one Q4_K_M, then Q8_0, then the first model file; `-hff` names one file
and wins), and huggingface_hub's `hf_hub_download` fetches it into the hub cache llama.cpp uses
(LLAMA_CACHE, else the Hugging Face cache: cache.py `default_cache`), resuming a partial download
and skipping a file already there. So `llama-server -hf` and `slotserver serve -hf` share their
downloads, and the router's `--models-cache` lists them. The hub is llama.cpp's MODEL_ENDPOINT or
HF_ENDPOINT (default huggingface.co); the token is `-hft`, else HF_TOKEN or the stored login.

Offline (`--offline`, LLAMA_ARG_OFFLINE, or huggingface_hub's HF_HUB_OFFLINE), or when the hub
cannot be reached or refuses (a token expired, a repository made private), the cache alone answers,
as llama.cpp falls back to it; a model in neither is one line saying both. A GGUF split into parts
is downloaded part by part (a part missing from the repository is refused by number), and a
repository without a model file is refused, listing what it has.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from slotserver.errors import ConfigError
from slotserver.hub import cache

log = logging.getLogger("slotserver.load")
PROGRESS_S = 0.5   # the shortest time between two progress reports of one download


def endpoint() -> str | None:
    """llama.cpp's MODEL_ENDPOINT, else HF_ENDPOINT (None: huggingface_hub's default)."""
    return (os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None


def offline_env() -> bool:
    """huggingface_hub's HF_HUB_OFFLINE (llama.cpp's LLAMA_ARG_OFFLINE is --offline, cli/llama_env.py)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "true", "yes")


def check_ref(ref: str) -> tuple[str, str]:
    """`USER/REPO[:QUANT]` -> (USER/REPO, QUANT or ""); a ConfigError for anything else."""
    repo, _, tag = ref.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"-hf {ref!r}: expected USER/MODEL[:QUANT], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M")
    return repo, tag


def choose(ref: str, token: str | None = None) -> str:
    """The repository file `USER/REPO[:QUANT]` names, from the hub's listing (no download): the
    router's POST /models checks a reference with it before downloading."""
    repo, tag = check_ref(ref)
    return _chosen(ref, _listing(repo, token), tag, None)


def fetch(ref: str, file: str | None = None, token: str | None = None, offline: bool = False,
          where: Path | None = None, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """`USER/REPO[:QUANT]` (or its file `file`) -> the local path of the model, downloaded if needed
    into `where` (default: llama.cpp's cache folder). `progress(file, done, total)`: called from the
    downloading thread as bytes arrive (at most every PROGRESS_S seconds, and at the end)."""
    repo, tag = check_ref(ref)
    where = where or cache.default_cache()
    if offline or offline_env():
        return cache.resolve(where, ref, file)
    try:
        names = _listing(repo, token)
    except Exception as e:   # no network, the hub down, a token expired: the cache answers if it can
        try:
            path = cache.resolve(where, ref, file)
        except ConfigError:
            if isinstance(e, ConfigError):   # the hub's own reason (gated, no such repository)
                raise e from None
            raise ConfigError(f"-hf {ref}: the hub did not answer ({_short(e)}) and the model is not in the "
                              f"cache {where}") from None
        log.warning("-hf %s: the hub did not answer (%s); serving the cached %s", ref, _short(e), path.name)
        return path
    name = _chosen(ref, names, tag, file)
    log.info("-hf %s: %s (into %s)", ref, name, where)
    return Path(download(repo, name, token, where, progress))


def _listing(repo: str, token: str | None) -> list[str]:
    """The repository's file paths at main: one request (huggingface_hub's listing retries a
    refused connection for ~25 s before an offline machine could fall back to its cache)."""
    import httpx
    from huggingface_hub import constants, get_token

    token = token or get_token()
    url = f"{endpoint() or constants.ENDPOINT}/api/models/{repo}/tree/main"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    names: list[str] = []
    params: dict | None = {"recursive": "true"}
    while url:
        r = httpx.get(url, params=params, headers=headers, timeout=15, follow_redirects=True)
        code = r.headers.get("X-Error-Code", "")
        if code == "GatedRepo" or r.status_code == 403:
            raise ConfigError(f"-hf {repo}: the repository is gated: accept its terms on the hub and give a token "
                              "(-hft TOKEN or HF_TOKEN)")
        if code == "RepoNotFound" or r.status_code in (401, 404):
            raise ConfigError(f"-hf {repo}: no such repository on the hub (or it is private: give a token, "
                              "-hft TOKEN or HF_TOKEN)")
        r.raise_for_status()
        entries = r.json()
        if not isinstance(entries, list):
            raise ValueError(f"the hub's listing of {repo} is not a list")
        names += [e["path"] for e in entries if isinstance(e, dict) and e.get("type") == "file"
                  and isinstance(e.get("path"), str)]
        url, params = r.links.get("next", {}).get("url"), None   # the hub pages long listings
    return names


def _chosen(ref: str, names: list[str], tag: str, file: str | None) -> str:
    ggufs = [n for n in names if n.endswith(".gguf")]
    if file is not None and file not in names:
        raise ConfigError(f"-hff {file}: not in {ref.partition(':')[0]} (its GGUF files: {', '.join(ggufs) or 'none'})")
    name = file or cache.pick(ggufs, tag)
    if name is None:
        raise ConfigError(f"-hf {ref}: no model file{' tagged ' + tag if tag else ''} in the repository "
                          f"(its GGUF files: {', '.join(ggufs) or 'none'})")
    parts, missing = cache.split_parts(names, name)
    if missing:
        raise ConfigError(f"-hf {ref}: {name} is one of {len(parts) + len(missing)} parts of a split GGUF, and "
                          f"part{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                          f"{'are' if len(missing) > 1 else 'is'} not in the repository")
    return parts[0]


def download(repo: str, name: str, token: str | None, where: Path,
             progress: Callable[[str, int, int], None] | None = None) -> str:
    """The repository's model file `name` (`_chosen`'s: a split GGUF's first part) into the cache
    `where`, every part of a split one after the other (each resumed, or skipped if there) -> the path
    of the first part, where the model loads from (model/gguf_split.py finds the others beside it)."""
    return [_download_file(repo, part, token, where, progress) for part in cache.part_names(name)][0]


def _download_file(repo: str, name: str, token: str | None, where: Path,
                   progress: Callable[[str, int, int], None] | None) -> str:
    from huggingface_hub import hf_hub_download

    # tqdm_class only where progress is asked for: older huggingface_hub releases lack the keyword
    extra = {} if progress is None else {"tqdm_class": _reporting_bar(name, progress)}
    try:
        return hf_hub_download(repo, name, cache_dir=where, token=token, endpoint=endpoint(), **extra)
    except Exception as e:   # network, disk full, the hub's HTTP errors
        raise ConfigError(f"-hf {repo}: downloading {name} into {where} failed: {_short(e)}") from None


def _reporting_bar(name: str, progress: Callable[[str, int, int], None]):
    """huggingface_hub's progress bar class, also reporting (name, done, total) to `progress`."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Bar(hub_tqdm):
        """Bytes counted here: a disabled bar (no terminal, HF_HUB_DISABLE_PROGRESS_BARS) keeps `n` at
        the resumed size. Xet downloads report bytes written to disk through update() and bytes off
        the network through update_transfer(), which is left out, so `done` only grows."""
        last, got = 0.0, None

        def update(self, n=1):
            start = int(self.n or 0) if self.got is None else self.got   # a resumed download starts past 0
            out = super().update(n)
            self.got = start + int(n or 0)
            now, total = time.monotonic(), int(self.total or 0)
            if now - self.last >= PROGRESS_S or (total and self.got >= total):
                self.last = now
                progress(name, self.got, total)
            return out

        def update_transfer(self, n=1) -> None:   # huggingface_hub's Xet reporter: network bytes
            pass

        def set_transfer_postfix_str(self, *args, **kwargs) -> None:
            pass
    return Bar


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__
