"""The README's two set-up commands are the ones CI runs and the demo really exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_has_exactly_two_setup_commands_demo_then_tests() -> None:
    commands = setup_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands), "each is one line a newcomer can paste"
    demo, tests = commands
    assert demo.endswith("-m langgraph_idem_saver demo")
    assert "pytest" in tests and "'.[dev]'" in tests


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup_commands()[1] in ci_lines
