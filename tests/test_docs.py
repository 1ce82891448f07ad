"""The documentation site's sources, checked without building it (the build is `make docs`).

* every name in ``sparsedp.__all__`` and in each public module's / subpackage's ``__all__`` is in the
  API reference (``docs/api/*.md``: a ``::: path`` directive or an autorefs link ``[...][path]``
  whose object is that very object);
* the offline check of ``docs/build.py`` finds resources on other hosts and nothing else;
* the hooks and the griffe extension rewrite what they should;
* ``make docs`` / ``.ci/run`` / the ``docs`` extra are wired.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import sparsedp

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API = DOCS / "api"
NOT_DOCUMENTED = {"cli", "__main__"}  # the command line: documented by `sparsedp COMMAND --help`

_DIRECTIVE = re.compile(r"^:::\s+([A-Za-z_][\w.]*)\s*$", re.MULTILINE)
_AUTOREF = re.compile(r"\]\[([A-Za-z_][\w.]*)\]")


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def resolve(path: str) -> Any:
    """The object a directive renders: the longest importable module prefix, then attributes (as
    griffe does: ``sparsedp.trees.blue`` is the submodule, even though ``sparsedp.trees.blue`` the
    attribute is the function ``blue`` imported from it)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def documented_paths() -> dict[str, set[str]]:
    """``{path: {page, ...}}`` for every directive and autorefs link of the API pages."""
    found: dict[str, set[str]] = {}
    for page in sorted(API.glob("*.md")):
        text = page.read_text()
        for path in _DIRECTIVE.findall(text) + _AUTOREF.findall(text):
            found.setdefault(path, set()).add(page.name)
    return found


def public_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(sparsedp.__path__)]
    return sorted(n for n in names if not n.startswith("_") and n not in NOT_DOCUMENTED)


def missing_from_reference(module_name: str, documented: dict[str, set[str]]) -> list[str]:
    module = importlib.import_module(module_name)
    by_name: dict[str, list[Any]] = {}
    for path in documented:
        if path.startswith("sparsedp"):
            by_name.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            ok = obj.__name__ in documented
        else:
            ok = any(resolve(path) is obj for path in by_name.get(name, []))
        if not ok:
            missing.append(f"{module_name}.{name}")
    return missing


def test_every_public_module_has_all_and_a_page():
    documented = documented_paths()
    modules = public_modules()
    assert {"measure", "consistency", "trees", "continual", "completion", "flows", "optimize", "io"} <= set(modules)
    for name in modules:
        module = importlib.import_module(f"sparsedp.{name}")
        assert isinstance(getattr(module, "__all__", None), (list, tuple)), f"sparsedp.{name} has no __all__"
        assert f"sparsedp.{name}" in documented, f"no '::: sparsedp.{name}' in docs/api/"
        assert (API / f"{name}.md").is_file()


@pytest.mark.parametrize("module_name", ["sparsedp"] + [f"sparsedp.{m}" for m in public_modules()])
def test_every_exported_name_is_in_the_api_reference(module_name):
    assert missing_from_reference(module_name, documented_paths()) == []


def test_the_coverage_check_fails_for_an_undocumented_name(monkeypatch):
    from sparsedp import io

    monkeypatch.setattr(io, "undocumented_helper", lambda: None, raising=False)
    monkeypatch.setattr(io, "__all__", [*io.__all__, "undocumented_helper", "ShapeError"])
    # ShapeError is documented (on the errors page: the same object); the helper is not
    assert missing_from_reference("sparsedp.io", documented_paths()) == ["sparsedp.io.undocumented_helper"]
    # a directive that renders another object of the same name does not count: a submodule shadowed
    # by the function it defines (griffe renders the module), or a namesake in another module
    documented = {"sparsedp.completion": {"c.md"}, "sparsedp.completion.dlnm_qr": {"c.md"}}
    assert "sparsedp.completion.dlnm_qr" in missing_from_reference("sparsedp.completion", documented)
    documented = {"sparsedp.continual": {"c.md"}, "sparsedp.accuracy.expected_error": {"a.md"}}
    assert "sparsedp.continual.expected_error" in missing_from_reference("sparsedp.continual", documented)


def test_every_api_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in API.glob("*.md"):
        assert f"api/{page.name}" in nav, page.name


def test_offline_check_finds_foreign_resources_only(tmp_path):
    build = load("build")
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<html><head><link rel="stylesheet" href="assets/main.css">'
        '<script src="assets/bundle.js"></script>'
        '<script src="http://localhost:8000/live.js"></script>'
        '<link rel="preconnect" href="https://fonts.gstatic.com">'
        '<style>@import url("https://fonts.googleapis.com/css?family=Roboto");</style></head>'
        '<body><a href="https://arxiv.org/abs/1234">a paper</a>'
        '<img srcset="img/a.png 1x, //cdn.example.org/a@2x.png 2x"></body></html>')
    (tmp_path / "sub" / "page.html").write_text('<script src="https://cdn.jsdelivr.net/npm/mathjax.js"></script>')
    (tmp_path / "sub" / "x.css").write_text("body{background:url(https://example.com/bg.png)} a{b:url(img/ok.png)}")
    bad = build.external_assets(tmp_path)
    assert len(bad) == 5
    joined = "\n".join(bad)
    for host in ("fonts.gstatic.com", "fonts.googleapis.com", "cdn.example.org", "cdn.jsdelivr.net", "example.com/bg"):
        assert host in joined
    assert "arxiv" not in joined and "localhost" not in joined and "bundle.js" not in joined
    assert build.is_external("//cdn.example.org/x.js") and not build.is_external("http://127.0.0.1:9/x.js")


def test_built_site_if_present_loads_nothing_from_other_hosts():
    site = ROOT / "build" / "site"
    if not (site / "index.html").is_file():
        pytest.skip("site not built (make docs)")
    assert load("build").external_assets(site) == []


def test_example_links_point_to_gallery_pages():
    hooks = load("hooks")

    class Page:
        class file:
            src_uri = "release.md"

    md = "see [spec](../examples/release_spec/ages.toml) and [q](../examples/quickstart.py) and [x](../examples/nope.py)"
    out = hooks.on_page_markdown(md, Page, None, None)
    assert "](gallery/release_spec.md)" in out and "](gallery/quickstart.md)" in out
    assert "](../examples/nope.py)" in out  # no gallery page: left for strict mode to report
    Page.file.src_uri = "api/x.md"
    assert "](../gallery/quickstart.md)" in hooks.on_page_markdown("[q](../examples/quickstart.py)", Page, None, None)


def test_unlisted_guide_pages_join_the_nav(tmp_path):
    hooks = load("hooks")
    for name, head in (("index.md", "# Home"), ("a.md", "# A page"), ("new.md", "# A `new` page")):
        (tmp_path / name).write_text(head + "\n")
    nav = [{"Home": "index.md"}, {"User guide": [{"A": "a.md"}]}, {"API": [{"x": "api/x.md"}]}]
    assert hooks.add_unlisted_guide_pages(nav, tmp_path) == ["new.md"]
    assert nav[1]["User guide"][-1] == {"A new page": "new.md"}
    assert hooks.add_unlisted_guide_pages(nav, tmp_path) == []  # now listed


def test_known_warning_filter_is_narrow():
    import logging

    hooks = load("hooks")
    assert hooks.KNOWN_DOCSTRING_WARNINGS == ()  # none tolerated today; the filter is tested with one
    hooks.KNOWN_DOCSTRING_WARNINGS = (
        ("sparsedp/noise.py", "Parameter 'Returns' does not appear in the function signature"),)
    known = hooks._KnownWarnings()

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("mkdocs.plugins.griffe", logging.WARNING, "", 0, msg, None, None)

    assert not known.filter(record("griffe: sparsedp/noise.py:803: Parameter 'Returns' does not appear in the function signature"))
    assert known.filter(record("griffe: sparsedp/measure.py:10: Parameter 'Returns' does not appear in the function signature"))
    assert known.filter(record("griffe: sparsedp/noise.py:900: Could not parse line 'something else'"))


def test_griffe_extension_rewrites_sphinx_roles():
    roles = load("griffe_roles")
    text = ("Uses :func:`plan_measurement` and :class:`~sparsedp.privacy.LedgerEntry`, :mod:`sparsedp.calibration`,\n"
            "see :meth:`MeasurementPlan.measure <x>` as follows::\n\n    code\n")
    out = roles.markdown_roles(text)
    assert "`plan_measurement`" in out and "`LedgerEntry`" in out and "`sparsedp.calibration`" in out
    assert "`MeasurementPlan.measure`" in out and ":func:" not in out and ":class:" not in out
    assert "as follows:\n" in out and "::" not in out
    doc = "Example:\n\n>>> x = 1\n>>> x + 1\n2\n\nAfter.\n```\n>>> kept as is\n```"
    assert roles.markdown_roles(doc) == "Example:\n\n```pycon\n>>> x = 1\n>>> x + 1\n2\n```\n\nAfter.\n```\n>>> kept as is\n```"


def test_make_docs_ci_and_extra_are_wired():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs: .*\n\t.*docs/build\.py", makefile, re.MULTILINE)
    assert "docs," in makefile or ",docs" in makefile  # installed by the install line
    assert "make docs" in (ROOT / ".ci" / "run").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^docs = \[.*"mkdocs>=1\.6".*"mkdocs-material>=9\.5".*"mkdocstrings\[python\]>=0\.25"', pyproject, re.MULTILINE)
    config = (ROOT / "mkdocs.yml").read_text()
    assert "font: false" in config and "strict: true" in config


def test_the_readme_quick_start_runs(tmp_path, monkeypatch, capsys):
    import re

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Quick start\n\n(?:.*?\n\n)??```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "release.npz").is_file() and "variance" in capsys.readouterr().out
