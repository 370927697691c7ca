"""The conformance tests, one module per contract area."""
