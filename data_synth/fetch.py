"""One file over HTTP(S) into place: checked against a recorded sha256, written atomically (``<dest>.part``,
then a rename), resumed with an HTTP ``Range`` request from whatever ``<dest>.part`` already holds (after
a cut connection, within the call and across calls), with a tqdm bar on a terminal.

Contract of :func:`fetch_file`: ``dest`` appears only complete and verified. A cut transfer keeps its
``.part`` (the next call resumes it); a checksum mismatch removes it and raises
:class:`~memgym.data_synth.errors.DataChecksumError`; an unreachable host raises
:class:`~memgym.data_synth.errors.NoNetworkError` before anything is written. Cost: one pass over the bytes
to hash them (about 1 s per 300 MB). Errors of the local disk (a folder in the way, no space) are
raised as they are, never retried."""
from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from memgym.data_synth.errors import DataChecksumError, DownloadError, NoNetworkError

CHUNK = 1 << 20
TIMEOUT_S = 60
USER_AGENT = "memgym-data-download"


def sha256_of(path: Path | str) -> str:
    """The hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means the host cannot be reached at all (no DNS, refused, no route, no answer),
        rather than a connection that opened and then broke."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, OSError) and not isinstance(reason, (ConnectionResetError, http.client.HTTPException))


def _bar(name: str, total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total or None, initial=initial, unit="B", unit_scale=True, unit_divisor=1024,
                desc=name, leave=False, disable=None)  # None: shown on a terminal only


def _open(url: str, start: int):
    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)


def _transfer(url: str, part: Path, size: int, name: str) -> tuple[bool, int]:
    """One request appending to ``part`` from its current length: (whether the body ended complete,
        bytes received)."""
    have = part.stat().st_size if part.exists() else 0
    if size and have > size:
        have = 0
    with _open(url, have) as resp:
        if have and resp.status != 206:  # the server ignored the Range: start over
            have = 0
        elif have and not (resp.headers.get("Content-Range") or "").startswith(f"bytes {have}-"):
            raise DownloadError(f"{url}: answered Range bytes={have}- with Content-Range "
                                f"{resp.headers.get('Content-Range')!r}")
        length = resp.headers.get("Content-Length")
        expected_end = have + int(length) if length is not None else size
        got = have
        with open(part, "ab" if have else "wb") as fh, _bar(name, size or expected_end or 0, have) as bar:
            try:
                while chunk := resp.read(CHUNK):
                    fh.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            except (http.client.IncompleteRead, ConnectionError, TimeoutError):
                return False, got - have
    return (not expected_end or got >= expected_end), got - have


def fetch_file(url: str, dest: Path | str, sha256: str, size: int = 0, *, attempts: int = 4) -> int:
    """Download ``url`` to ``dest`` (see the module contract); returns the bytes transferred by this
        call (0 when ``dest`` already held the file). ``size``: the expected length (0: unknown);
        ``attempts``: requests tried before a cut transfer is reported (each resumes the last)."""
    dest = Path(dest)
    if dest.is_file() and (not size or dest.stat().st_size == size) and sha256_of(dest) == sha256:
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    complete, transferred = False, 0
    for attempt in range(attempts):
        try:
            complete, got = _transfer(url, part, size, dest.name)
            transferred += got
        except urllib.error.HTTPError as e:
            if e.code == 416 and part.exists() and size and part.stat().st_size == size:
                complete = True  # the part already held every byte
            else:
                raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
            if attempt == 0 and not part.exists() and _unreachable(e):
                raise NoNetworkError(url, str(getattr(e, "reason", e))) from None
            complete = False
        if complete:
            break
    if not complete:
        raise DownloadError(f"{url}: the transfer was cut {attempts} times; {part} keeps the "
                            f"{part.stat().st_size if part.exists() else 0} bytes received, run again to resume")
    actual = sha256_of(part)
    if actual != sha256:
        part.unlink()
        raise DataChecksumError(dest, sha256, actual, url)
    os.replace(part, dest)
    return transferred
