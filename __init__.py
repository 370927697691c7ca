"""vLLM async-RL control-plane conformance suite, as the package vllm_rl_conformance (installed,
or a checkout / vendored copy through .import/). Its pytest plugin: fixtures/plugin/entry.py."""
