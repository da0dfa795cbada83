"""The documentation: a site that builds strictly, a README a newcomer can scan, and a
pre-commit configuration that runs what ``make lint`` runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: One public name of each face the API reference documents (an anchor of its page).
API_NAMES = {
    "capture": "lakefold.capture.Capture",
    "store": "lakefold.store.ChangelogStore",
    "eventstore": "lakefold.eventstore.EventStore",
    "eventstore-arrow": "lakefold.eventstore.arrow.read_events_range",
    "projections": "lakefold.projections.view",
    "spark": "lakefold.spark.run_query",
    "schemas": "lakefold.schemas.EventRegistry",
    "schemas-arrow": "lakefold.schemas.arrow",
}


def _nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for item in nav:
        if isinstance(item, str):
            pages.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                pages.extend(_nav_pages(value) if isinstance(value, list) else [str(value)])
    return pages


def _config() -> dict[str, object]:
    # mkdocs.yml has no custom YAML tags, so the safe loader reads it whole.
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert isinstance(config, dict)
    return config


@pytest.mark.timeout(240)
def test_the_site_builds_strictly_offline_with_the_api_reference(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a page left out of the navigation,
    a snippet that is gone or an API reference that no longer resolves fails the build."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's notice about its successor
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stdout + out.stderr
    for page, name in API_NAMES.items():
        html = (site / "api" / page / "index.html").read_text()
        assert f'id="{name}"' in html, (page, name)
    # these pages are the root's files themselves, included at build time
    for page, title in (("architecture", "lakefold architecture"),
                        ("contributing", "Contributing to lakefold"), ("changelog", "Changelog")):
        assert title in (site / page / "index.html").read_text(), page


def test_every_page_is_in_the_navigation_and_every_nav_entry_exists() -> None:
    pages = _nav_pages(_config()["nav"])  # type: ignore[arg-type]
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk


def test_readme_keeps_the_quickstart_a_short_tour_and_links() -> None:
    """Two commands on a fresh clone, a short tour, and a link to every guide; the guides
    themselves live in docs/."""
    readme = README.read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("```", 2)[1]
    commands = [line.split("#", 1)[0].strip() for line in quickstart.splitlines()[1:]]
    assert [c for c in commands if c] == ["make demo", "make test"]
    assert "## A short tour" in readme
    assert len(readme.splitlines()) < 150
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", readme))
    for link in linked:
        assert (REPO / link).is_file(), link
    guides = {f"docs/{p}" for p in _nav_pages(_config()["nav"])  # type: ignore[arg-type]
              if not p.startswith("api/")
              and p not in ("index.md", "architecture.md", "contributing.md", "changelog.md")}
    assert guides <= linked, guides - linked


def _lint_commands() -> list[str]:
    """The commands of the Makefile's ``lint`` recipe, with ``$(BIN)`` spelled out."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [line.strip().replace("$(BIN)", ".venv/bin") for line in recipe if line.strip()]


def test_pre_commit_runs_what_make_lint_runs() -> None:
    """Local hooks (no network, no environments to install) calling the same .venv tools as
    ``make lint``, in the same order, on the whole tree."""
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    (repo,) = config["repos"]
    assert repo["repo"] == "local"
    hooks = repo["hooks"]
    assert all(h["language"] == "system" and h.get("pass_filenames") is False for h in hooks)
    assert [h["entry"] for h in hooks] == _lint_commands()


FACES = ["lakefold.capture", "lakefold.store", "lakefold.eventstore",
         "lakefold.projections", "lakefold.spark", "lakefold.schemas"]


@pytest.mark.parametrize("face", FACES)
def test_a_face_docstring_says_where_a_name_it_does_not_export_lives(face: str) -> None:
    """A face's docstring that lists a name of one of its public modules (say
    ``read_events_range``, which moved to ``lakefold.eventstore.arrow``) names that module:
    a reader who tries ``from lakefold.eventstore import read_events_range`` is not misled."""
    import importlib
    import pkgutil

    package = importlib.import_module(face)
    doc = package.__doc__ or ""
    mentioned = set(re.findall(r"``([A-Za-z_][A-Za-z0-9_]*)", doc))
    exported = set(getattr(package, "__all__", ()))
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{face}.{info.name}")
        elsewhere = (set(getattr(module, "__all__", ())) - exported) & mentioned
        if elsewhere:
            assert f"``{module.__name__}``" in doc, (module.__name__, sorted(elsewhere))
