"""Screenshots of the built site with headless Chromium, and a check that nothing came from the network.

    python docs/screenshots.py [--site build/site] [--out docs/screenshots] [--width 1280] [--height 1500]

Serves the built site (``make docs``) on ``127.0.0.1`` from a thread, opens the home page, one API
page and one gallery page in Debian's ``chromium`` (installed with ``apt-get install -y chromium``
when missing and running as root), saves a PNG of each (re-saved with a palette above 300 KB) and
records Chromium's network log (``--log-net-log``).  Every request the *page* starts (initiator: the
local server's origin -- stylesheets, scripts, images, fonts, the search index and its web worker)
must go to ``127.0.0.1``; any other address is listed and the script fails.  Requests Chromium
makes for itself (initiator "not an origin": its update, time and account services) are counted
separately; host resolution is mapped to nothing except ``127.0.0.1``
(``--host-resolver-rules``), so not even those leave the machine.  Chromium runs with
``--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
--disable-component-update --disable-sync`` and a temporary profile.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlparse

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS))

from build import shrink_png

PAGES = {"home": "index.html", "api": "api/measure.html", "gallery": "gallery/flow_map.html"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=4000",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "chromium"], check=True, env=env)
        path = shutil.which("chromium")
        if path:
            return path
    raise SystemExit("chromium is missing: run 'sudo apt-get install -y chromium' (Debian's package)")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requested: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        _Quiet.requested.append(self.path)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def requests(netlog: dict) -> list[tuple[str, str]]:
    """``(url, initiator)`` of every URL request in a Chromium net log (``URL_REQUEST_START_JOB``)."""
    kind = netlog["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [(e["params"]["url"], str(e["params"].get("initiator", "")))
            for e in netlog["events"] if e["type"] == kind and "url" in e.get("params", {})]


def page_requests_elsewhere(netlog: dict, base: str) -> tuple[list[str], list[str], int]:
    """(page requests to other hosts, the browser's own requests to other hosts, page requests in all)."""
    origin = base.rstrip("/")
    host = urlparse(base).hostname
    page, own, count = [], [], 0
    for url, initiator in requests(netlog):
        elsewhere = urlparse(url).hostname != host
        if initiator == origin:
            count += 1
            if elsewhere:
                page.append(url)
        elif elsewhere:
            own.append(url)
    return sorted(set(page)), sorted(set(own)), count


def shoot(browser: str, url: str, png: Path, width: int, height: int, profile: Path, netlog: Path) -> None:
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
           f"--screenshot={png}", f"--log-net-log={netlog}", url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0 or not png.is_file():
        raise SystemExit(f"chromium failed on {url} ({proc.returncode}):\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", default=str(ROOT / "build" / "site"))
    ap.add_argument("--out", default=str(DOCS / "screenshots"))
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1500)
    args = ap.parse_args(argv)
    site, out = Path(args.site), Path(args.out)
    if not (site / "index.html").is_file():
        raise SystemExit(f"no built site in {site}: run 'make docs' first")
    out.mkdir(parents=True, exist_ok=True)
    browser = chromium()
    server, base = serve(site)
    problems: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="sparsedp-chromium-") as d:
            for name, page in PAGES.items():
                profile, netlog, png = Path(d) / f"profile-{name}", Path(d) / f"{name}.netlog.json", out / f"{name}.png"
                _Quiet.requested.clear()
                shoot(browser, base + page, png, args.width, args.height, profile, netlog)
                log = json.loads(netlog.read_text(errors="replace"))
                foreign, own, count = page_requests_elsewhere(log, base)
                size = shrink_png(png)
                print(f"{png} ({size // 1024} KB): the page made {count} requests, {len(foreign)} to other hosts; "
                      f"{len(_Quiet.requested)} served locally; Chromium's own background requests "
                      f"(blocked): {len(own)}")
                problems += [f"{page}: {u}" for u in foreign]
    finally:
        server.shutdown()
    if problems:
        print("the pages requested addresses on other hosts:\n  " + "\n  ".join(problems))
        return 1
    print("nothing was fetched from the network")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
