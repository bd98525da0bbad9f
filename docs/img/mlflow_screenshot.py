"""Regenerate docs/img/mlflow-compare.png: MLflow's comparison view of a sweep's trials, in a real browser.

    python docs/img/mlflow_screenshot.py [--store sqlite:///mlflow.db] [--experiment mneme] [--runs 6]
           [--params replay.passes,replay.codegen_opt,...] [--metric registers] [--out docs/img/mlflow-compare.png]

Starts `mlflow server` on the store, opens the compare page of the latest sweep's first trials in headless
Chromium (Debian's `chromium` package) driven over the DevTools protocol (aiohttp, which MLflow brings),
picks the parallel-coordinates axes, turns on "show diff only", and saves a screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return urllib.request.urlopen(url, timeout=2).read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def pick_runs(store: str, experiment: str, n: int):
    from mlflow import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    sweeps = client.search_runs([exp.experiment_id], "tags.`mneme.role` = 'sweep'", order_by=["attributes.start_time DESC"])
    flt = "tags.`mneme.role` = 'trial'" + (f" and tags.mlflow.parentRunId = '{sweeps[0].info.run_id}'" if sweeps else "")
    trials = client.search_runs([exp.experiment_id], flt, order_by=["attributes.start_time ASC"])
    return exp.experiment_id, [r.info.run_id for r in trials if r.info.status == "FINISHED"][:n]


async def drive(url: str, out: Path, params, metric: str, width: int, height: int) -> None:
    import aiohttp

    port = free_port()
    profile = tempfile.mkdtemp(prefix="mneme-chromium-")
    browser = subprocess.Popen(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
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
            await call("Page.navigate", url=url)
            await asyncio.sleep(8)
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
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--params", default="replay.block.x,replay.grid.x",
                    help="parallel-coordinates axes (compile-only sweeps: e.g. replay.passes,replay.codegen_opt)")
    ap.add_argument("--metric", default="exec_time_median_ns", help="the colored axis (compile-only: registers)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("mlflow-compare.png")))
    ap.add_argument("--size", default="1600x1500")
    a = ap.parse_args()
    exp_id, runs = pick_runs(a.store, a.experiment, a.runs)
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
        asyncio.run(drive(url, Path(a.out), a.params.split(","), a.metric, width, height))
    finally:
        import os
        import signal

        os.killpg(server.pid, signal.SIGTERM)
        server.wait(20)
    print(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
