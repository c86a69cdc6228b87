"""Regenerate the screenshots of docs/quickstart.md (docs/img/*.png) from a real run.

    .venv/bin/python docs/screenshots.py            # needs Debian's `chromium` (apt-get install chromium)
    .venv/bin/python docs/screenshots.py --out DIR  # write the PNGs elsewhere

It runs the Prefect block of docs/quickstart.md exactly as docs/quickstart.py does (a private Prefect home and data directory,
a free port, a server with its UI, a worker on the process pool, a pipeline run on Cora), then a second run of the
same job in data-parallel mode (something to compare), starts `mlflow ui` on the runs' database, drives headless
Chromium over the DevTools protocol (so it can wait for each page's data and close MLflow's assistant panel), saves
1400x900 screenshots and stops everything it started.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

DOCS = Path(__file__).resolve().parent
WIDTH, HEIGHT = 1400, 900
MAX_BYTES = 300_000
#: The same job in data-parallel mode: something to compare with the quickstart's tensor-parallel run.
SECOND_RUN = (
    "prefect deployment run pipeline/pipeline --watch --flow-run-name synthetic-data-parallel --params "
    + shlex.quote(
        json.dumps(
            {
                "params": {
                    "dataset": {"name": "synthetic"},
                    "training": {"epochs": 20, "mode": "data"},
                    "launch": {"nproc": 2, "device": "cpu"},
                }
            }
        )
    )
)


def _quickstart():
    if "docs_quickstart" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docs_quickstart", DOCS / "quickstart.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["docs_quickstart"] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules["docs_quickstart"]


class Browser:
    """Headless Chromium driven over the DevTools protocol (the `websockets` package Prefect already installs)."""

    def __init__(self, root: Path, executable: str = "chromium") -> None:
        from websockets.sync.client import connect

        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=root))  # a fresh profile every time
        port_file = self.profile / "DevToolsActivePort"
        with (root / "chromium.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    executable,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    "--no-first-run",
                    "--mute-audio",
                    f"--window-size={WIDTH},{HEIGHT}",
                    f"--user-data-dir={self.profile}",
                    "--remote-debugging-port=0",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not start:\n{(root / 'chromium.log').read_text()[-3000:]}")
                time.sleep(0.2)
            port = int(port_file.read_text().split()[0])
            pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            page = next(p for p in pages if p["type"] == "page")
            self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
            self.next_id = 0
            self.send("Page.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            )
        except BaseException:
            _quickstart().stop_group(self.proc)
            raise

    def send(self, method: str, params: dict | None = None, timeout: float = 60) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.1)))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression: str) -> object:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        return result.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def wait_for(self, condition: str, what: str, timeout: float = 60) -> None:
        """Poll the JavaScript ``condition`` until it is true; then let the page settle a moment."""
        deadline = time.monotonic() + timeout
        while not self.js(f"Boolean({condition})"):
            if time.monotonic() > deadline:
                text = self.js("document.body ? document.body.innerText.slice(0, 1500) : ''")
                raise RuntimeError(f"timed out waiting for {what}; the page shows:\n{text}")
            time.sleep(0.5)
        time.sleep(1.5)

    def wait_text(self, *texts: str, timeout: float = 60) -> None:
        cond = " && ".join(f"document.body && document.body.innerText.includes({json.dumps(t)})" for t in texts)
        self.wait_for(cond, f"the text {texts!r}", timeout)

    def type_into(self, selector: str, text: str, settle: float = 3.0) -> None:
        """Focus the element and type ``text`` as a user would (React sees real input events)."""
        if not self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "if (e) { e.focus(); return true; } return false; })()"
        ):
            raise RuntimeError(f"no element {selector!r} to type into")
        self.send("Input.insertText", {"text": text})
        time.sleep(settle)

    def close_mlflow_assistant(self) -> None:
        """Close MLflow's assistant side panel (open by default for a local server) if it is there."""
        self.js("""(() => { const b = document.querySelector(
            '[data-component-id="mlflow.assistant.chat_panel.close"]'); if (b) b.click(); })()""")
        time.sleep(1.0)

    def screenshot(self, path: Path) -> Path:
        png = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_small_png(png))
        print(f"  {path} ({path.stat().st_size // 1000} KB)")
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
        finally:
            _quickstart().stop_group(self.proc)


def _small_png(png: bytes) -> bytes:
    """The PNG as is, or with a 256-colour palette when it is over MAX_BYTES (screenshots of UIs lose nothing)."""
    if len(png) <= MAX_BYTES:
        return png
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256).save(out, format="PNG", optimize=True)
    return out.getvalue()


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} does not answer after {timeout} s:\n{log.read_text()[-3000:]}")


def take_screenshots(out: Path, root: Path) -> list[Path]:
    qs = _quickstart()
    with qs.readme_session(root=root) as session:
        session.run(SECOND_RUN, timeout=600)
        tp_run, dp_run = session.flow_run_ids[0], session.flow_run_ids[-1]

        from mlflow.tracking import MlflowClient

        client = MlflowClient(session.mlflow_uri)
        exp = client.get_experiment_by_name("synthetic")
        mlflow_runs = {}
        for flow_run_id in (tp_run, dp_run):
            found = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
            mlflow_runs[flow_run_id] = found[0].info.run_id

        # `mlflow ui` as the quickstart says, in its own terminal, on the runs' database
        mlflow_port = qs.free_port()
        mlflow_log = root / "mlflow.log"
        with mlflow_log.open("wb") as log:
            mlflow_ui = subprocess.Popen(
                [
                    "bash",
                    "-c",
                    session.shell(
                        f"mlflow ui --backend-store-uri {session.mlflow_uri} --host 127.0.0.1 --port {mlflow_port}"
                    ),
                ],
                cwd=qs.PROJECT,
                env=session.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            mlflow_url = f"http://127.0.0.1:{mlflow_port}"
            _wait_http(f"{mlflow_url}/health", mlflow_ui, mlflow_log)
            shots = shoot(
                out,
                root,
                prefect_url=session.url,
                mlflow_url=mlflow_url,
                flow_runs=(tp_run, dp_run),
                mlflow_runs=(mlflow_runs[tp_run], mlflow_runs[dp_run]),
                experiment_id=exp.experiment_id,
            )
        finally:
            qs.stop_group(mlflow_ui)
    return shots


def shoot(
    out: Path,
    root: Path,
    *,
    prefect_url: str,
    mlflow_url: str,
    flow_runs: tuple[str, str],
    mlflow_runs: tuple[str, str],
    experiment_id: str,
) -> list[Path]:
    """The screenshots, from running servers: the flow runs and MLflow runs are (tensor parallel, data parallel)."""
    qs = _quickstart()
    api = f"{prefect_url}/api"
    shots: list[Path] = []
    browser = Browser(root)
    try:
        # Prefect: the flow run's page (graph of the tasks, logs), its results artifact, the typed form
        browser.goto(f"{prefect_url}/runs/flow-run/{flow_runs[0]}")
        browser.wait_for("document.querySelector('canvas')", "the flow run's graph")
        browser.wait_text("Completed", "Logs", "submitting flow run")
        shots.append(browser.screenshot(out / "prefect-flow-run.png"))
        artifacts = qs.get_json(
            f"{api}/artifacts/filter",
            {"artifacts": {"flow_run_id": {"any_": [flow_runs[0]]}, "key": {"exists_": True}}},
        )
        browser.goto(f"{prefect_url}/artifacts/artifact/{artifacts[0]['id']}")
        browser.wait_text("MLflow")
        shots.append(browser.screenshot(out / "prefect-artifact.png"))
        deployment = qs.get_json(f"{api}/deployments/name/pipeline/pipeline")
        browser.goto(f"{prefect_url}/deployments/deployment/{deployment['id']}/run")
        browser.wait_text("From Dir", "Parameters")
        shots.append(browser.screenshot(out / "prefect-run-form.png"))

        # MLflow: the run (overview, then its curves) and the two runs side by side (the experiment's chart view)
        view = "workflowType=machine_learning"
        run_page = f"{mlflow_url}/#/experiments/{experiment_id}/runs/{mlflow_runs[0]}"
        browser.goto(f"{run_page}?{view}")
        browser.wait_text("About this run", "rank-0", "Finished")
        browser.close_mlflow_assistant()
        shots.append(browser.screenshot(out / "mlflow-run.png"))
        browser.goto(f"{run_page}/model-metrics?{view}")
        browser.wait_for("document.querySelector('svg.main-svg')", "the metric charts")
        browser.close_mlflow_assistant()
        browser.type_into('input[placeholder="Search metric charts"]', "^(loss|train_metric|valid_metric|test_metric)$")
        shots.append(browser.screenshot(out / "mlflow-run-metrics.png"))
        train_runs = urllib.parse.quote("tags.`ntp.kind` = 'train'")
        browser.goto(
            f"{mlflow_url}/#/experiments/{experiment_id}/runs?compareRunsMode=CHART&searchFilter={train_runs}&{view}"
        )
        browser.wait_for("document.querySelector('svg.main-svg')", "the comparison charts")
        browser.wait_text("2 matching runs")
        browser.close_mlflow_assistant()
        browser.type_into('input[placeholder="Search metric charts"]', "^(loss|valid_metric|bytes_per_rank_per_epoch)$")
        shots.append(browser.screenshot(out / "mlflow-compare.png"))
    finally:
        browser.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DOCS / "img", help="where the PNGs go (default: docs/img)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="work in DIR and keep it (logs, databases)")
    args = parser.parse_args(argv)
    if shutil.which("chromium") is None:
        print("chromium is not installed: sudo apt-get install chromium", file=sys.stderr)
        return 1
    root = args.keep or Path(tempfile.mkdtemp(prefix="ntp-screenshots-"))
    try:
        shots = take_screenshots(args.out, root)
    except RuntimeError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{len(shots)} screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
