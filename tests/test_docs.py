"""The user-facing documents stay consistent with the repository.

Cheap checks that catch documentation rot: a results file renamed or never committed, a table
left as a template placeholder, and CI drifting away from the README's test command.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A Python format field left unfilled, alone on its line or inside a table cell.
PLACEHOLDER = re.compile(r"^\s*\{[a-z_]+\}\s*$|\|\s*\{[a-z_]+\}\s*\|")


def prose_lines(text):
    """Lines outside fenced code blocks (code may legitimately contain braces)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


@pytest.mark.parametrize("name", DOCUMENTS)
def test_relative_links_point_to_committed_files(name):
    text = (ROOT / name).read_text()
    missing = []
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # web address or in-page anchor
            path = target.split("#", 1)[0]
            if not ((ROOT / name).parent / path).exists():  # relative to the document, as GitHub reads it
                missing.append(f"{name}:{number}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", DOCUMENTS)
def test_no_unfilled_template_fields(name):
    text = (ROOT / name).read_text()
    left = [f"{name}:{number}: {line.strip()}" for number, line in prose_lines(text) if PLACEHOLDER.search(line)]
    assert not left, "template fields never filled in:\n" + "\n".join(left)


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith("#")]
    assert "./dev test" in ci_commands, ".ci/run must call the README's test command, ./dev test"
    assert re.search(r"^\./dev test\b", readme, re.MULTILINE), "the README must give ./dev test as the test command"


def test_readme_stays_short_and_benchmarks_md_is_gone():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 320
    assert not (ROOT / "BENCHMARKS.md").exists(), "decisions go to docs/decisions.md, results to docs/benchmarks.md"


def test_results_tables_are_what_the_committed_runs_give():
    """The README's and docs/benchmarks.md's tables are generated (benchmarks.headline), never hand-edited."""
    from benchmarks.headline import DOCUMENTS as MARKED, MARKER, rewrite

    for path in MARKED:
        text = path.read_text()
        assert MARKER.search(text), f"{path.name} has no results block"
        assert rewrite(text) == text, f"{path.name}'s results tables are stale: run ./dev run python -m benchmarks.headline"


def test_tracked_results_stay_small():
    import subprocess

    files = subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    size = sum((ROOT / f).stat().st_size for f in files if (ROOT / f).exists())
    assert len(files) <= 30 and size < 5e6, f"{len(files)} files, {size / 1e6:.1f} MB under benchmarks/results"


MODULE = re.compile(r"python -m benchmarks\.([a-z_]+)")
RESULTS_FILE = re.compile(r"benchmarks/results/([\w.{},*-]+)")
OLD_TREE = "036b7d1"  # the commit whose tree still holds the studies and results files removed on 2026-12-02


@pytest.mark.parametrize("name", DOCUMENTS)
def test_named_scripts_and_results_files_exist(name):
    """A ``python -m benchmarks.<study>`` or ``benchmarks/results/<file>`` in a paragraph exists today, unless
    the paragraph says it is in the old commit's tree."""
    paragraphs = (ROOT / name).read_text().split("\n\n")
    missing = []
    for paragraph in paragraphs:
        if OLD_TREE in paragraph:
            continue
        for module in MODULE.findall(paragraph):
            if not (ROOT / "benchmarks" / f"{module}.py").exists():
                missing.append(f"{name}: python -m benchmarks.{module}")
        for file in RESULTS_FILE.findall(paragraph):
            stem = re.split(r"[{*]", file)[0].rstrip(".")
            if not any(p.name.startswith(stem) for p in (ROOT / "benchmarks" / "results").iterdir()):
                missing.append(f"{name}: benchmarks/results/{file}")
    assert not missing, "named but not in the repository (say where they are, e.g. commit 036b7d1):\n" + "\n".join(missing)
