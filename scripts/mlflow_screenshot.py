"""Screenshots of a sweep in MLflow's UI, in a real browser: the runs page (run names, the sweep's parent
expanded) and the comparison view of its trials (parallel coordinates of kernel and knobs against a metric).

    python scripts/mlflow_screenshot.py [--store sqlite:///mlflow.db] [--experiment mneme] [--runs 8] [--sweeps N]
           [--params kernel,replay.block.x,replay.passes,replay.specialize] [--metric exec_time_median_ns]
           [--out docs/img/mlflow-compare.png] [--runs-out docs/img/mlflow-runs.png]

Starts `mlflow server` on the store, opens the pages in headless Chromium (Debian's `chromium` package,
installed through apt-get when missing) driven over the DevTools protocol (aiohttp, which MLflow brings),
picks the parallel-coordinates axes, turns on "show diff only", and saves the screenshots. For a
compile-only store use --metric registers. It needs no GPU: a GPU sweep's store is made on the GPU machine by
scripts/sweep-store.sh and unpacked here (docs/EXPERIMENTS.md, "In the MLflow UI").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def ensure_chromium() -> str:
    """The chromium executable, installed with apt-get (Debian 12: package `chromium`) when missing."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print("mlflow_screenshot: installing chromium (apt-get install chromium)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=False, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    return "chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return urllib.request.urlopen(url, timeout=2).read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _trial_order(run):
    """A sweep's trials in trial-number order (the mneme.trial tag); start times alone tie at MLflow's millisecond
    resolution when trials are logged quickly, which shuffled them."""
    number = run.data.tags.get("mneme.trial", "")
    return (int(number) if number.lstrip("-").isdigit() else float("inf"), run.info.start_time or 0)


def pick_runs(store: str, experiment: str, n: int, sweeps: int = 1):
    """(experiment id, up to n finished trial runs, the latest sweep's name): the trials of the latest `sweeps`
    sweep parents, an equal share of each (a sweep per kernel puts the kernel on an axis of the compare view)."""
    from mlflow import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        known = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise SystemExit(f"mlflow_screenshot: no experiment {experiment!r} in {store} (experiments: {known})")
    parents = client.search_runs([exp.experiment_id], "tags.`mneme.role` = 'sweep'",
                                 order_by=["attributes.start_time DESC"])[:max(1, sweeps)]
    flts = [f"tags.`mneme.role` = 'trial' and tags.mlflow.parentRunId = '{p.info.run_id}'" for p in parents] \
        or ["tags.`mneme.role` = 'trial'"]
    share, runs = max(1, n // len(flts)), []
    for flt in reversed(flts):  # oldest sweep first, as the runs page lists them below the newest
        trials = sorted(client.search_runs([exp.experiment_id], flt), key=_trial_order)
        runs += [r.info.run_id for r in trials if r.info.status == "FINISHED"][:share]
    return exp.experiment_id, runs[:n], (parents[0].info.run_name if parents else "")


async def drive(url: str, out: Path, params, metric: str, width: int, height: int, runs_url: str = "",
                runs_out: Path = None, browser_exe: str = "chromium", sweep_name: str = "") -> None:
    import aiohttp

    port = free_port()
    profile = tempfile.mkdtemp(prefix="mneme-chromium-")
    browser = subprocess.Popen([browser_exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
                                f"--window-size={width},{height}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tabs = json.loads(wait_for(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in tabs if t["type"] == "page")
        async with aiohttp.ClientSession() as session, session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))

            async def call(method, **p):
                i = next(ids)
                await ws.send_json({"id": i, "method": method, "params": p})
                while True:
                    m = await ws.receive_json()
                    if m.get("id") == i:
                        return m.get("result", {})

            async def key(name, code):
                for kind in ("keyDown", "keyUp"):
                    await call("Input.dispatchKeyEvent", type=kind, key=name, code=name, windowsVirtualKeyCode=code)

            async def js(expr):
                return (await call("Runtime.evaluate", expression=expr, returnByValue=True)).get("result", {}).get("value")

            async def choose(input_id, values):
                await js(f"document.getElementById('{input_id}').focus()")
                for v in values:
                    await asyncio.sleep(0.4)
                    await call("Input.insertText", text=v)
                    await asyncio.sleep(0.4)
                    await key("Enter", 13)

            await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            async def until(expr, seconds=120):
                for _ in range(int(seconds * 2)):
                    if await js(expr):
                        return True
                    await asyncio.sleep(0.5)
                return False

            if runs_url and runs_out is not None:
                await call("Page.navigate", url=runs_url)
                await until(f"document.body.innerText.includes({json.dumps(sweep_name)})")  # the table has loaded
                await asyncio.sleep(2)
                await js("(Array.from(document.querySelectorAll('button')).find(b => b.getAttribute('aria-label')==='Close')||{click(){}}).click()")
                # expand the sweep's parent row so its trials show with their names
                await js("(function(){var a=Array.from(document.querySelectorAll('a')).find(x => x.innerText.includes("
                         f"{json.dumps(sweep_name[:12])}));if(!a)return;var row=a.closest('[role=row]')||a.parentElement.parentElement;"
                         "var b=row.querySelector('button,[role=button]');if(b)b.click();})()")
                await until("/ #\\d/.test(document.body.innerText)", 30)
                await asyncio.sleep(2)
                shot = await call("Page.captureScreenshot", format="png")
                runs_out.write_bytes(base64.b64decode(shot["data"]))
            await call("Page.navigate", url=url)
            await until("document.querySelectorAll('input[type=search]').length >= 2", 120)
            await asyncio.sleep(3)
            await js("(Array.from(document.querySelectorAll('button')).find(b => b.getAttribute('aria-label')==='Close')||{click(){}}).click()")
            await js("(Array.from(document.querySelectorAll('button')).find(b => b.innerText==='Clear All')||{click(){}}).click()")
            await asyncio.sleep(1)
            inputs = await js("Array.from(document.querySelectorAll('input[type=search]')).map(i => i.id)")
            if inputs and len(inputs) >= 2:
                await choose(inputs[0], params)
                await choose(inputs[1], [metric])
            await key("Escape", 27)
            await js("document.activeElement && document.activeElement.blur()")
            await js("Array.from(document.querySelectorAll('[role=switch]')).slice(0,2).forEach(s => s.click())")
            await asyncio.sleep(2)
            shot = await call("Page.captureScreenshot", format="png")
            out.write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.terminate()
        browser.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="mneme")
    ap.add_argument("--runs", type=int, default=8, help="trials in the compare view (default 8)")
    ap.add_argument("--sweeps", type=int, default=1,
                    help="take the trials from the latest N sweeps, N/runs from each (default 1; sweep-store.sh makes 2)")
    ap.add_argument("--params", default="kernel,replay.block.x,replay.passes,replay.specialize",
                    help="parallel-coordinates axes (default: the kernel and knobs of the standard space; compile-only "
                         "sweeps: e.g. kernel,replay.passes,replay.codegen_opt)")
    ap.add_argument("--metric", default="exec_time_median_ns", help="the colored axis (compile-only: registers)")
    img = Path(__file__).resolve().parent.parent / "docs" / "img"
    ap.add_argument("--out", default=str(img / "mlflow-compare.png"), help="the compare view's screenshot")
    ap.add_argument("--runs-out", default=str(img / "mlflow-runs.png"), help="the runs page's screenshot ('' for none)")
    ap.add_argument("--size", default="1600x1500")
    a = ap.parse_args()
    browser_exe = ensure_chromium()
    exp_id, runs, sweep_name = pick_runs(a.store, a.experiment, a.runs, a.sweeps)
    if not runs:
        print(f"no finished trial runs in experiment {a.experiment!r} of {a.store}", file=sys.stderr)
        return 1
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", a.store,
                               "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/health")
        url = f"http://127.0.0.1:{port}/#/compare-runs?runs={json.dumps(runs)}&experiments={json.dumps([exp_id])}"
        width, height = (int(v) for v in a.size.split("x"))
        runs_url = f"http://127.0.0.1:{port}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
        asyncio.run(drive(url, Path(a.out), a.params.split(","), a.metric, width, height, runs_url,
                          Path(a.runs_out) if a.runs_out else None, browser_exe, sweep_name))
    finally:
        import signal

        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    print("\n".join(p for p in (a.out, a.runs_out) if p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
