"""Which MLflow store to use, and whether it can be used, decided before any GPU work starts."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from mneme.errors import ConfigurationError

#: MLflow's own default local store (relative to the working directory).
DEFAULT_URI = "sqlite:///mlflow.db"

_OFF_HINT = "or turn tracking off (tracking.enabled=false in a Hydra app, --no-track for `mneme tune`)"


def resolve_uri(uri: Optional[str] = None) -> str:
    """The tracking URI: the given one, else MLFLOW_TRACKING_URI, else ./mlflow.db; made absolute.

    Absolute because Hydra jobs may change directory and the writer runs in another process: every
    run of a sweep must land in the one store the user meant.
    """
    uri = (uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI).strip()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        if rel and rel != ":memory:":
            return "sqlite:///" + str(Path(rel).resolve())
    if uri.startswith("file:") or "://" not in uri:
        path = uri[len("file://"):] if uri.startswith("file://") else uri[len("file:"):] if uri.startswith("file:") else uri
        return "file://" + str(Path(path).resolve())
    from mneme.tune.study import with_available_driver

    return with_available_driver(uri)  # postgresql:// works with psycopg2 alone, as for the Optuna storage


def local_path(uri: str) -> Optional[Path]:
    """The file or directory behind a local store URI (None for servers and databases)."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):] or ".")
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    return None


#: MLflow's HTTP client: per-request timeout and retries (its defaults, 120 s and 7 retries with backoff, make an
#: unreachable or stalled server look like a hang of many minutes); the user's own settings win
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def bounded_http() -> None:
    """Give MLflow's HTTP client short timeouts and few retries (set before the first request; inherited by
    writer processes)."""
    for k, v in HTTP_ENV.items():
        os.environ.setdefault(k, v)


def check_store(uri: str, timeout: float = 5.0, write: bool = True) -> None:
    """Refuse a store that cannot work, naming the setting to change.

    Servers are probed at /health with a short timeout (MLflow's client would retry for minutes), and
    MLflow's own requests get bounded timeouts (`bounded_http`); local stores need a writable directory
    (`write=False`: only that they exist). Databases (postgresql://...) are checked by the writer when it
    connects.
    """
    if uri.startswith(("http://", "https://")):
        bounded_http()
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                if resp.status >= 400:
                    raise urllib.error.HTTPError(url, resp.status, "bad status", resp.headers, None)
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise ConfigurationError(
                f"MLflow tracking server {uri} is unreachable ({reason}); start it (`mlflow server`), "
                f"set tracking.uri or MLFLOW_TRACKING_URI to a running one, {_OFF_HINT}"
            ) from None
        return
    path = local_path(uri)
    if path is None:
        return
    if not write:
        if not path.exists():
            raise ConfigurationError(f"MLflow store {uri}: {path} does not exist; set --tracking-uri or "
                                     "MLFLOW_TRACKING_URI to the store the runs were logged to")
        if uri.startswith("sqlite:") and path.is_file() and path.stat().st_size > 0:
            _check_sqlite_file(uri, path)
        return
    directory = path.parent if uri.startswith("sqlite:") else path if path.is_dir() else path.parent
    if not directory.is_dir():
        raise ConfigurationError(
            f"MLflow store {uri}: directory {directory} does not exist; create it or set tracking.uri / "
            f"MLFLOW_TRACKING_URI to a writable place, {_OFF_HINT}"
        )
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigurationError(
            f"MLflow store {uri} is not writable; set tracking.uri or MLFLOW_TRACKING_URI to a writable place, "
            f"{_OFF_HINT}"
        )
    if uri.startswith("sqlite:") and path.is_file() and path.stat().st_size > 0:
        _check_sqlite_file(uri, path)


def _check_sqlite_file(uri: str, path: Path) -> None:
    """A file that is not an SQLite database (a half-copied or overwritten mlflow.db): MLflow would retry
    connecting to it for about 100 s before giving up."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True, timeout=1.0)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        if "locked" in str(e) or "busy" in str(e):
            return  # in use by another process: a database after all
        raise ConfigurationError(
            f"MLflow store {uri}: {path} is not a usable SQLite database ({e}); move it away (MLflow then "
            f"creates a new one there) or set tracking.uri / MLFLOW_TRACKING_URI to another store, {_OFF_HINT}"
        ) from None
