"""The suite's CPU weight-transfer backend (fixtures/tier2/gloo_transfer.py) without a server:
both ranks in this process (the worker on a thread), a stand-in model that records what it
loads. Tensors arrive bit for bit, packed or one by one; a receive whose trainer stops sending
fails within the group's timeout instead of hanging."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = [pytest.mark.selftest, pytest.mark.timeout(120)]

torch = pytest.importorskip("torch")
gloo = pytest.importorskip("vllm_rl_conformance.fixtures.tier2.gloo_transfer")
from vllm_rl_conformance.fixtures import tier2  # noqa: E402
from vllm_rl_conformance.fixtures.tier2.weight_source import StateDictSource  # noqa: E402


class Recorder:
    def __init__(self):
        self.loaded: dict[str, "torch.Tensor"] = {}
        self.calls = 0

    def load_weights(self, pairs):
        self.calls += 1
        self.loaded.update({n: t.clone() for n, t in pairs})


STATE = {
    "embed.weight": torch.arange(3000, dtype=torch.float32).reshape(100, 30),
    "layers.0.norm.weight": torch.linspace(-1, 1, 30),
    "layers.0.proj.weight": torch.randn(64, 30, generator=torch.Generator().manual_seed(0)),
    "layers.0.ids": torch.arange(7, dtype=torch.int64),
    "lm_head.weight": torch.randn(100, 30, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
}


def worker(info) -> "gloo.GlooWeightTransferEngine":
    engine = object.__new__(gloo.GlooWeightTransferEngine)  # no vLLM config: rank and model set by hand
    engine.group, engine.info, engine.model = None, None, Recorder()
    engine.group = gloo.open_group(info.master_address, info.master_port, 1, 2, info.timeout_s)
    engine.info = info
    return engine


def joined(packed: bool, buffer_bytes: int, timeout_s: float = 10.0, during=None):
    """A trainer and a worker joined in one group; `during()` runs while both are joined."""
    port, fd = gloo.held_port("127.0.0.1")
    info = gloo.GlooWeightTransferInitInfo(master_address="127.0.0.1", master_port=port, rank_offset=1,
                                           world_size=2, timeout_s=timeout_s, packed=packed,
                                           packed_buffer_size_bytes=buffer_bytes)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("worker", worker(info)))
    t.start()
    trainer_group = gloo.open_group("127.0.0.1", port, 0, 2, timeout_s, listen_fd=fd)
    t.join(timeout_s)
    if during is not None:
        box["during"] = during()
    trainer = gloo.GlooTrainerWeightTransferEngine(
        client=None, source=StateDictSource.make(STATE),
        info=gloo.GlooTrainerInitInfo(master_address="127.0.0.1", master_port=info.master_port, world_size=2, rank=0,
                                      timeout_s=timeout_s, packed=packed, packed_buffer_size_bytes=buffer_bytes))
    trainer.group = trainer_group
    return (trainer, box["worker"]) if during is None else (trainer, box["worker"], box["during"])


def listening_addresses() -> set[str]:
    """host:port of every TCP socket this process listens on (/proc/net/tcp{,6} by socket inode)."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                host = ".".join(str(b) for b in raw[::-1]) if width == 8 else raw.hex()
                found.add(f"{host}:{int(port, 16)}")
    return found


@pytest.mark.skipif(not __import__("os").path.exists("/proc/net/tcp"), reason="capability missing: /proc/net/tcp")
def test_the_group_listens_on_loopback_only():
    before = listening_addresses()
    *_, during = joined(True, 1 << 10, during=listening_addresses)
    opened = during - before
    assert opened, "the group opened no listening socket this process could see"
    assert all(a.startswith("127.0.0.1:") for a in opened), f"the group listens beyond loopback: {sorted(opened)}"


@pytest.mark.parametrize("change, refused", [
    ({"master_address": "0.0.0.0"}, "master_address '0.0.0.0' is not the configured one"),
    ({"master_address": "10.1.2.3"}, "is not the configured one"),
    ({"world_size": 100000}, "world_size 100000 is outside"),
    ({"timeout_s": 86400.0}, "timeout_s 86400.0 is outside"),
    ({"packed_buffer_size_bytes": 1 << 40}, "packed_buffer_size_bytes"),
    ({"master_port": 0}, "master_port 0 is outside"),
])
def test_a_worker_refuses_an_init_for_another_address_or_with_sizes_out_of_bounds(change, refused):
    info = gloo.GlooWeightTransferInitInfo(**{"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                                              "world_size": 2, **change})
    assert gloo.init_problem(gloo.GlooWeightTransferInitInfo(master_address="127.0.0.1", master_port=29500,
                                                             rank_offset=1, world_size=2)) is None
    problem = gloo.init_problem(info)
    assert problem and refused in problem, f"{change}: {problem!r}; expected it to say {refused!r}"


def test_a_worker_refuses_an_update_larger_than_its_bound_or_naming_no_dtype():
    engine = object.__new__(gloo.GlooWeightTransferEngine)
    engine.group, engine.info, engine.model = object(), object(), Recorder()
    huge = gloo.GlooWeightTransferUpdateInfo(names=["w"], dtype_names=["float32"], shapes=[[1 << 20, 1 << 20]])
    with pytest.raises(ValueError, match="add up to more than"):
        engine.receive_weights(huge)
    with pytest.raises(ValueError, match="are not torch dtypes"):
        gloo.GlooWeightTransferUpdateInfo(names=["w"], dtype_names=["os"], shapes=[[1]]).entries()
    assert engine.model.calls == 0, "a refused update loaded something"


def test_the_reload_hooks_the_installed_release_has_are_found_and_a_missing_one_refuses_the_init_and_skips_the_row(
        monkeypatch):
    start, finish, loading, missing = gloo.reload_hooks()
    assert missing is None and callable(start) and callable(finish) and callable(loading), gloo.reload_hooks()
    monkeypatch.setattr(gloo, "reload_hooks", lambda: (None, None, None, "reload has no layerwise reload"))
    engine = object.__new__(gloo.GlooWeightTransferEngine)
    engine.group, engine.info, engine.model = None, None, Recorder()
    info = gloo.GlooWeightTransferInitInfo(master_address="127.0.0.1", master_port=29500, rank_offset=1, world_size=2)
    for call in (lambda: engine.init_transfer_engine(info), engine.start_weight_update):
        with pytest.raises(NotImplementedError, match=tier2.CPU_BACKEND_CANNOT_RUN):
            call()
        with pytest.raises(pytest.skip.Exception, match="reload has no layerwise reload"):
            with tier2.skipped_if_backend_cannot_run():
                call()
    assert engine.group is None and engine.model.calls == 0, "a refused init or start touched the group or the model"
    with pytest.raises(RuntimeError, match="500 Server Error"):  # another failure is raised as it is
        with tier2.skipped_if_backend_cannot_run():
            raise RuntimeError("500 Server Error")


def test_chunks_hold_at_most_the_buffer_and_a_larger_parameter_travels_alone():
    entries = [(n, t.dtype, tuple(t.shape)) for n, t in STATE.items()]
    sizes = [gloo.nbytes(d, s) for _, d, s in entries]  # 12000, 120, 7680, 56, 6000
    got = gloo.chunks(entries, 8000)
    assert got == [[0], [1, 2, 3], [4]], f"chunks {got} for sizes {sizes} and an 8000-byte buffer"
    assert sum(got, []) == list(range(len(entries)))


@pytest.mark.parametrize("packed,buffer_bytes", [(True, 8000), (True, 1 << 20), (False, 0)],
                         ids=["packed-several-chunks", "packed-one-chunk", "one-by-one"])
def test_every_tensor_arrives_bit_for_bit(packed, buffer_bytes):
    trainer, engine = joined(packed, buffer_bytes)
    info = trainer.update_info()
    t = threading.Thread(target=trainer.broadcast, args=(info,))
    t.start()
    engine.receive_weights(info)
    t.join(10)
    assert set(engine.model.loaded) == set(STATE)
    for name, want in STATE.items():
        got = engine.model.loaded[name]
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), (
            f"{name}: received {got.dtype} {tuple(got.shape)}, sent {want.dtype} {tuple(want.shape)}")
    want_calls = len(gloo.chunks(info.entries(), buffer_bytes)) if packed else len(STATE)
    assert engine.model.calls == want_calls, f"load_weights called {engine.model.calls} times, {want_calls} batches"


def test_a_receive_whose_trainer_stops_sending_fails_within_the_timeout():
    trainer, engine = joined(True, 8000, timeout_s=2.0)
    info = trainer.update_info()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        engine.receive_weights(info)  # the trainer never broadcasts
    took = time.monotonic() - t0
    assert took < 2.0 + 3.0, f"the receive failed after {took:.1f} s; the group's timeout is 2 s"
    assert engine.model.calls == 0, f"{engine.model.calls} batches loaded from a trainer that sent nothing"
    print(f"failed after {took:.1f} s: {str(err.value)[:160]}")


def test_the_checkout_plugin_declares_the_entry_point_of_the_installed_package():
    """.vllm-plugin/ (what servers launched from a checkout see) and pyproject.toml (an installed
    suite) name the same vllm.general_plugins entry point, and it is importable."""
    import configparser
    import importlib
    import tomllib

    from vllm_rl_conformance.fixtures import SUITE_ROOT
    from vllm_rl_conformance.fixtures.driver.server import plugin_paths

    declared = tomllib.loads((SUITE_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    [dist_info] = (SUITE_ROOT / ".vllm-plugin").glob("*.dist-info")
    parser = configparser.ConfigParser()
    parser.read(dist_info / "entry_points.txt")
    checkout = dict(parser["vllm.general_plugins"])
    assert checkout == declared, f".vllm-plugin declares {checkout}, pyproject.toml {declared}"
    for value in declared.values():
        module, _, attr = value.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), value
    assert str(SUITE_ROOT / ".vllm-plugin") in plugin_paths(), f"launched servers get {plugin_paths()}"
