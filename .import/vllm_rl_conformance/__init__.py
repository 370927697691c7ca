"""A checkout or vendored copy of the suite, imported as the package vllm_rl_conformance: the
package's modules are the suite's directory (two levels up). conftest.py puts .import/ on
sys.path, so no other name of the suite (fixtures, conformance, selftests) becomes importable."""

import os

__path__ = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
