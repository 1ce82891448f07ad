"""Build the documentation site: gallery pictures, ``mkdocs build --strict``, offline check.

    python docs/build.py [--skip-gallery] [--site DIR]

1. **Gallery.** Runs every script in ``examples/`` in a temporary directory (one process each,
   ``MPLBACKEND=Agg``, BLAS pinned to one thread unless the caller set it) and writes what it
   prints (``NAME.txt``) and the pictures it draws (``NAME*.png``) into ``docs/gallery/img/``
   (generated files, ignored by git).  A PNG above ``MAX_PNG_BYTES`` is re-saved with a
   256-colour palette.  ``--skip-gallery`` keeps the files of an earlier run when all exist.
2. **Site.** ``python -m mkdocs build --strict`` (``mkdocs.yml``): a broken link, a missing
   page or an API reference that cannot be collected fails the build.
3. **Offline check.** No page of the built site may load anything from another host: every
   ``<script src>``, ``<link href>``, ``<img src>``, ``<iframe>``/``<source>``/``<video>``/
   ``<audio>``/``<embed>``/``<object>`` address and every CSS ``url(...)``/``@import`` must be
   relative or on ``localhost`` (plain ``<a href>`` links to papers are fine: nothing is fetched
   until a reader clicks).  :func:`external_assets` lists the offenders; any is an error.

``make docs`` runs this script; ``.ci/run`` runs ``make docs``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
IMG = DOCS / "gallery" / "img"
EXAMPLES = ROOT / "examples"
MAX_PNG_BYTES = 300_000
TIMEOUT = 600  # seconds per example

# name -> (arguments; "{img}" is docs/gallery/img, "{tmp}" the run's directory) and the pictures it
# leaves in {tmp} (copied to img/<name>_<file>) -- flow_map writes straight into img/.
GALLERY: dict[str, tuple[list[str], list[str]]] = {
    "quickstart": ([], []),
    "tree_histogram": ([], []),
    "restaurant_release": ([], []),
    "custom_constraint_family": ([], []),
    "continual_counter": ([], []),
    "flow_map": (["{img}/flow_map.png"], []),
    "inpaint_image": (["--out", "{tmp}"], ["original.png", "observed_private.png", "dlnm_qr.png", "soft_impute.png"]),
    "optimize_custom_workload": ([], []),
    "marginals_release": (["--plot", "{tmp}/marginals.png"], ["marginals.png"]),
    "topdown_release": (["--out", "{tmp}/topdown_release.npz"], []),
    "retail_customer_marginals": ([], []),
}
RELEASE_SPEC = "release_spec"  # examples/release_spec/: make_ages.py, then `sparsedp release ages.toml`


def example_env() -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def run_logged(cmd: list[str], cwd: Path, tmp: Path) -> str:
    """Run ``cmd`` and return what it printed (stdout, then stderr), with ``tmp`` shown as ``OUT``."""
    proc = subprocess.run(cmd, cwd=cwd, env=example_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"docs/build.py: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    text = proc.stdout + (proc.stderr if proc.stderr.strip() else "")
    return text.replace(str(tmp), "OUT")


def shrink_png(path: Path, limit: int = MAX_PNG_BYTES) -> int:
    """Re-save ``path`` with an adaptive 256-colour palette if it is larger than ``limit`` bytes; its size."""
    if path.stat().st_size > limit:
        from PIL import Image

        with Image.open(path) as im:
            small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        small.save(path, optimize=True)
    return path.stat().st_size


def gallery_outputs() -> list[Path]:
    """Every file the gallery pages include."""
    files = [IMG / f"{name}.txt" for name in [*GALLERY, RELEASE_SPEC]]
    files += [IMG / "flow_map.png", IMG / "release_spec.png", IMG / "release_spec_report.md"]
    files += [IMG / f"inpaint_image_{p}" for p in GALLERY["inpaint_image"][1]]
    files += [IMG / f"marginals_release_{p}" for p in GALLERY["marginals_release"][1]]
    return files


def build_gallery() -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    for name, (args, pictures) in GALLERY.items():
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"sparsedp-{name}-") as d:
            tmp = Path(d)
            argv = [a.format(img=IMG, tmp=tmp) for a in args]
            text = run_logged([python, str(EXAMPLES / f"{name}.py"), *argv], tmp, tmp)
            (IMG / f"{name}.txt").write_text(text.replace(str(IMG), "docs/gallery/img"))
            for pic in pictures:
                shutil.copyfile(tmp / pic, IMG / f"{name}_{pic}")
        print(f"gallery: {name} ({time.perf_counter() - start:.1f} s)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sparsedp-release-spec-") as d:
        tmp = Path(d) / RELEASE_SPEC
        shutil.copytree(EXAMPLES / RELEASE_SPEC, tmp, ignore=shutil.ignore_patterns("ages.csv", "ages_re*"))
        text = run_logged([python, str(tmp / "make_ages.py")], tmp, tmp)
        text += run_logged([python, "-m", "sparsedp", "release", str(tmp / "ages.toml")], tmp, tmp)
        (IMG / f"{RELEASE_SPEC}.txt").write_text(text)
        shutil.copyfile(tmp / "ages_report.png", IMG / "release_spec.png")
        shutil.copyfile(tmp / "ages_report.md", IMG / "release_spec_report.md")
    print(f"gallery: {RELEASE_SPEC} ({time.perf_counter() - start:.1f} s)")
    for png in sorted(IMG.glob("*.png")):
        size = shrink_png(png)
        if size > MAX_PNG_BYTES:
            raise SystemExit(f"docs/build.py: {png} is {size} bytes even with a palette")


def build_site(site: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"docs/build.py: mkdocs build --strict failed ({proc.returncode})")


# ---------------------------------------------------------------------------------------------
# Offline check
# ---------------------------------------------------------------------------------------------

# tag -> attributes whose address the browser fetches by itself
FETCHED = {
    "script": ("src",),
    "link": ("href",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "source": ("src", "srcset"),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "track": ("src",),
    "input": ("src",),
}
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
_CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*((?:https?:)?//[^'")\s]+)""", re.IGNORECASE)


def is_external(address: str) -> bool:
    """Whether ``address`` points to another host (``http(s)://host/...`` or ``//host/...``)."""
    address = address.strip()
    if not (address.lower().startswith(("http://", "https://", "//"))):
        return False
    host = urlparse(address if not address.startswith("//") else "http:" + address).hostname or ""
    return host not in LOCAL_HOSTS


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str]] = []
        self._style = False
        self._css: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = FETCHED.get(tag, ())
        for key, value in attrs:
            if value is None:
                continue
            if key in names:
                for part in value.split(",") if key == "srcset" else [value]:
                    address = part.strip().split(" ")[0]
                    if is_external(address):
                        self.found.append((tag, address))
            if key == "style":
                self.found += [("style", u) for u in _CSS_URL.findall(value) if is_external(u)]
        if tag == "style":
            self._style = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._style = False

    def handle_data(self, data: str) -> None:
        if self._style:
            self.found += [("style", u) for u in _CSS_URL.findall(data) if is_external(u)]


def external_assets(site: Path) -> list[str]:
    """``file: tag address`` for every resource of the built site that would be fetched from another host."""
    bad: list[str] = []
    for page in sorted(site.rglob("*.html")):
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        bad += [f"{page.relative_to(site)}: <{tag}> {address}" for tag, address in parser.found]
    for css in sorted(site.rglob("*.css")):
        for address in _CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            if is_external(address):
                bad.append(f"{css.relative_to(site)}: url({address})")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-gallery", action="store_true", help="reuse the gallery files of an earlier run if all exist")
    ap.add_argument("--site", default=str(ROOT / "build" / "site"), help="output directory (default build/site)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    if not (args.skip_gallery and all(p.is_file() for p in gallery_outputs())):
        build_gallery()
    missing = [str(p) for p in gallery_outputs() if not p.is_file()]
    if missing:
        raise SystemExit("docs/build.py: gallery files missing: " + ", ".join(missing))
    site = Path(args.site)
    build_site(site)
    bad = external_assets(site)
    if bad:
        raise SystemExit("docs/build.py: the site loads resources from other hosts:\n  " + "\n  ".join(bad))
    pages = sum(1 for _ in site.rglob("*.html"))
    print(f"docs: {pages} pages in {site}, nothing loaded from other hosts ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
