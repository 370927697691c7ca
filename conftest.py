"""Runs this directory's suite (a checkout or a vendored copy) with its pytest plugin,
fixtures/plugin/entry.py, importing it as the package vllm_rl_conformance from .import/ (so none of
its generic names, fixtures or conformance, can collide with a repository's own)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if (HERE / ".import").is_dir() and str(HERE / ".import") not in sys.path:
    sys.path.insert(0, str(HERE / ".import"))

from vllm_rl_conformance.fixtures.plugin import entry as plugin  # noqa: E402


def pytest_addoption(parser, pluginmanager):
    plugin.adopt(pluginmanager, HERE)


# The suite's fixtures, defined again here: a fixture in a conftest.py closer to a test wins,
# so a repository that vendors this copy keeps its own fixtures of the same names (settings,
# model, ...) from replacing the suite's in the suite's tests.
from vllm_rl_conformance.fixtures.plugin.pytest_fixtures import *  # noqa: E402,F401,F403
