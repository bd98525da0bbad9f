"""A PostgreSQL server of our own on loopback for the tests that need a database server (one per session;
installed with apt-get when missing and we are root). The `postgres_url` fixture lives in conftest.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from glob import glob
from pathlib import Path

import pytest


def _pg_bindir():
    for d in sorted(glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(d, "initdb").exists():
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _install_postgres() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-qq", "postgresql"], ["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "postgresql"]):
        p = subprocess.run(cmd, capture_output=True, env=env, timeout=900)
        if cmd[1] == "install" and p.returncode == 0:
            return


def postgres_server():
    """A PostgreSQL server of our own on 127.0.0.1 (installed with apt-get when missing and we are root);
    yields a function that creates a database on it and returns its URL."""
    pytest.importorskip("psycopg2")
    bindir = _pg_bindir()
    if bindir is None and os.geteuid() == 0 and shutil.which("apt-get"):
        _install_postgres()
        bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed and cannot be installed here (needs root and apt-get)")
    base = Path(tempfile.mkdtemp(prefix="mneme-pg-"))
    run_as = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    data, sock = base / "data", base / "sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def pg(*argv, check=True):
        p = subprocess.run([*run_as, *map(str, argv)], capture_output=True, text=True, timeout=120)
        if check and p.returncode != 0:
            raise AssertionError(f"{argv[0]} failed: {p.stdout}\n{p.stderr}")
        return p

    pg("mkdir", "-p", sock)
    pg(bindir / "initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync")
    pg(bindir / "pg_ctl", "-D", data, "-l", base / "server.log", "-w", "-o",
       f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", "start")
    count = iter(range(1 << 30))

    def new_database() -> str:
        """postgresql://... of a fresh database: MLflow and Optuna each keep an `alembic_version` table,
        so two users of one database would see each other's schema."""
        name = f"mneme_{next(count)}"
        pg(bindir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", name)
        return f"postgresql://postgres@127.0.0.1:{port}/{name}"

    try:
        yield new_database
    finally:
        pg(bindir / "pg_ctl", "-D", data, "-m", "immediate", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)
