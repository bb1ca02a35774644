"""The user-facing documents stay consistent with the repository.

Cheap checks that catch documentation rot: a results file renamed or never committed, a table
left as a template placeholder, and CI drifting away from the README's test command.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", "BENCHMARKS.md", "docs/decisions.md"]
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
            if not (ROOT / path).exists():
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
