"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks: [docs/hooks.py]``).

* Links from a user-guide page to a script in ``examples/`` (outside the docs folder, right when the
  page is read on GitHub) point, on the site, to that example's gallery page, which shows its
  source, its output and its picture.  Strict mode still fails on any other broken link.
* A top-level page of ``docs/`` that the ``nav`` of ``mkdocs.yml`` does not list is appended to the
  "User guide" section (titled by its first heading), so a new guide page appears on the site
  without a nav edit and a clean clone never references a page that is not committed yet.
* Known docstring-format warnings of code the docs do not own are listed in ``KNOWN_DOCSTRING_WARNINGS``
  (each with the file and the exact message, never a blanket filter) and reported by
  ``docs/build.py`` instead of failing the strict build; every other warning fails it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

GALLERY = Path(__file__).resolve().parent / "gallery"

# (file, message fragment) of griffe warnings tolerated until the docstring is fixed at its source.
KNOWN_DOCSTRING_WARNINGS: tuple[tuple[str, str], ...] = ()

_EXAMPLE_LINK = re.compile(r"\]\(\.\./examples/([A-Za-z0-9_]+)(?:\.py|/[^)#\s]*)?\)")


class _KnownWarnings(logging.Filter):
    """Drop exactly the listed warnings; count them so the build can report them."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for path, fragment in KNOWN_DOCSTRING_WARNINGS:
            if path in message and fragment in message:
                self.dropped.append(message)
                return False
        return True


KNOWN = _KnownWarnings()


def nav_files(nav: object) -> set[str]:
    """Every page file a (nested) MkDocs ``nav`` value references."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(nav_files(v) for v in nav.values())) if nav else set()
    if isinstance(nav, list):
        return set().union(*(nav_files(v) for v in nav)) if nav else set()
    return set()


def page_title(path: Path) -> str:
    """The first ``# heading`` of a markdown page (without backticks), else its file name."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].replace("`", "").strip()
    return path.stem


def add_unlisted_guide_pages(nav: list, docs_dir: Path, section: str = "User guide") -> list[str]:
    """Append the top-level pages of ``docs_dir`` missing from ``nav`` to ``section``; their names."""
    listed = nav_files(nav)
    added = []
    for entry in nav:
        if isinstance(entry, dict) and section in entry:
            for page in sorted(docs_dir.glob("*.md")):
                if page.name not in listed:
                    entry[section].append({page_title(page): page.name})
                    added.append(page.name)
    return added


def on_config(config):
    if config.get("nav"):
        added = add_unlisted_guide_pages(config["nav"], Path(config["docs_dir"]))
        if added:
            logging.getLogger("mkdocs.hooks").info("pages added to the User guide nav: %s", ", ".join(added))
    return config


def on_startup(command: str, dirty: bool) -> None:
    logger = logging.getLogger("mkdocs.plugins.griffe")
    if KNOWN not in logger.filters:
        logger.addFilter(KNOWN)


def example_link(match: re.Match[str], prefix: str = "") -> str:
    """``](../examples/NAME.py)`` or ``](../examples/NAME/...)`` -> the gallery page of NAME."""
    name = match.group(1)
    if (GALLERY / f"{name}.md").is_file():
        return f"]({prefix}gallery/{name}.md)"
    return match.group(0)  # left as is: strict mode reports it


def on_page_markdown(markdown: str, page, config, files) -> str:
    prefix = "../" * page.file.src_uri.count("/")
    return _EXAMPLE_LINK.sub(lambda m: example_link(m, prefix), markdown)


def on_post_build(config) -> None:
    if KNOWN.dropped:
        logging.getLogger("mkdocs.hooks").info(
            "tolerated %d known docstring warning(s) listed in docs/hooks.py (fix them at the source): %s",
            len(KNOWN.dropped), "; ".join(sorted(set(KNOWN.dropped))))
