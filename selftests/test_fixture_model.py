"""The locally built fixture models: reproducible, decodable, and useful for testing
(greedy output is varied, V1 and V2 really differ)."""

import hashlib
import json
from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures.driver import model_builder
from vllm_rl_conformance.fixtures.driver.client import complete

pytestmark = pytest.mark.selftest


def digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(path).iterdir())}


@pytest.fixture(scope="module")
def built_twice(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return [model_builder.build(root / f"v1-{i}", model_builder.SEEDS["v1"]) for i in (1, 2)]


def test_the_same_seed_builds_byte_identical_files(built_twice):
    a, b = (digests(p) for p in built_twice)
    assert a == b, f"two builds with the same seed differ: {[k for k in a if a.get(k) != b.get(k)]}"


def test_v1_and_v2_share_architecture_and_tokenizer_and_differ_in_weights(built_twice, tmp_path):
    v1 = digests(built_twice[0])
    v2 = digests(model_builder.build(tmp_path / "v2", model_builder.SEEDS["v2"]))
    same = {k for k in v1 if v1[k] == v2.get(k)}
    assert "model.safetensors" not in same, "V1 and V2 have identical weights"
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert name in same, f"{name} differs between V1 and V2"


def test_the_vocabulary_equals_the_model_vocab_size_and_every_id_decodes(built_twice):
    from tokenizers import Tokenizer

    path = built_twice[0]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    assert tok.get_vocab_size() == vocab, f"tokenizer has {tok.get_vocab_size()} ids, model {vocab}"
    undecodable = [i for i in range(vocab) if tok.id_to_token(i) is None]
    assert not undecodable, f"ids without a token: {undecodable[:10]}"
    text = "pause/resume: ünïcödé ✓"
    assert tok.decode(tok.encode(text).ids) == text, "byte-level round trip failed"


def test_a_cached_build_is_reused_and_a_stale_one_rebuilt(tmp_path):
    first = model_builder.ensure("v1", tmp_path)
    stamp = (first / model_builder.STAMP).stat().st_mtime_ns
    assert model_builder.ensure("v1", tmp_path) == first
    assert (first / model_builder.STAMP).stat().st_mtime_ns == stamp, "a current build was rebuilt"
    (first / model_builder.STAMP).write_text("stale\n")
    model_builder.ensure("v1", tmp_path)
    assert model_builder.is_current(first, model_builder.SEEDS["v1"]), "a stale build was not rebuilt"


def test_greedy_generation_from_the_served_fixture_model_is_varied(settings, vllm_server, model, record_property):
    if settings.model or settings.attach:
        pytest.skip("checks the embedded fixture model; this run serves another model")
    c = complete(vllm_server, model, "Once upon a time", 128)
    ids = c.token_ids
    distinct = len(set(ids))
    period = next((p for p in range(1, 33) if all(ids[i] == ids[i + p] for i in range(len(ids) - p))), None)
    record_property("observed", f"{distinct} distinct ids in {len(ids)} greedy tokens; period {period}")
    assert distinct >= 32 and period is None, (
        f"greedy output is degenerate: {distinct} distinct ids, repeats with period {period}: {ids[:40]}")
