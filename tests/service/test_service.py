"""The decode service: served batches equal local decoding's, whatever happens to the servers."""

from __future__ import annotations

import io
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import ddpipe
from ddpipe.decode import DecodeOptions
from ddpipe.errors import DdpipeError, SampleError
from ddpipe.service import wire
from ddpipe.service.client import ServiceDecoder

from .servers import Server, servers, start_server

Batches = list[tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(scope="module")
def natural(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ddpipe.synth import encode_jpeg, render_image

    root = tmp_path_factory.mktemp("served") / "wds"
    samples = ({"__key__": f"n/{i:03d}", "jpg": encode_jpeg(render_image(i, seed=3, long_side=120)),
                "cls": b"%d" % (i % 3)} for i in range(30))
    ddpipe.write_dataset(root, samples, samples_per_shard=10, classes=["a", "b", "c"])
    return root


def options(service: list[str] | tuple[str, ...] = (), decoder: str = "dali-cpu", **kw: object) -> DecodeOptions:
    return DecodeOptions(decoder=decoder, device="cpu", size=24, resize_shorter=28, dtype="uint8", threads=1,
                         service=tuple(service), **kw)  # type: ignore[arg-type]


def loader(root: Path, decode: DecodeOptions, **kw: object) -> ddpipe.Loader:
    return ddpipe.Loader(root, 4, decode=decode, shuffle="local", seed=5, **kw)  # type: ignore[arg-type]


def epoch(ld: ddpipe.Loader, e: int = 0) -> Batches:
    ld.set_epoch(e)
    return [(x.clone(), y.clone()) for x, y in ld]


def same(a: Batches, b: Batches) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v)
                                    for (x, y), (u, v) in zip(a, b, strict=True))


def stats(ld: ddpipe.Loader) -> ddpipe.service.client.ServiceStats:
    decoder = ld.decoding._decoder
    assert isinstance(decoder, ServiceDecoder)
    return decoder.stats


@pytest.mark.parametrize("decoder", ["dali-cpu", "pil"])
@pytest.mark.parametrize("n", [1, 2])
def test_served_batches_are_bit_identical_to_local_decoding(natural: Path, decoder: str, n: int) -> None:
    local = loader(natural, options(decoder=decoder))
    expected = [epoch(local, e) for e in (0, 1)]
    local.close()
    with servers(n) as started:
        served = loader(natural, options([s.endpoint for s in started], decoder))
        got = [epoch(served, e) for e in (0, 1)]
        st = stats(served)
        served.close()
    assert same(got[0], expected[0]) and same(got[1], expected[1])
    assert not same(got[0], got[1])  # the epochs differ, so equality above says something
    assert st.local_batches == 0 and st.remote_batches == 2 * len(expected[0])
    assert len(st.by_server) == n  # spread over every server


def test_a_server_says_where_it_listens_as_it_was_asked() -> None:
    """With IPv6 on, ZeroMQ reports an IPv4 address mapped (``[::ffff:127.0.0.1]``): the address users
    copy into --decode-service is given back as they wrote it."""
    from ddpipe.service.transport import ZmqListener

    for asked, said in (("127.0.0.1:0", r"tcp://127\.0\.0\.1:\d+"), ("tcp://*:0", r"tcp://\[::\]:\d+")):
        listener = ZmqListener(asked, 1 << 20, 4)
        try:
            assert re.fullmatch(said, listener.endpoint), listener.endpoint
        finally:
            listener.close()


def test_a_server_listening_has_loaded_what_decoding_needs() -> None:
    """A server's first request paid for importing torch, the decoders and DALI (1.4-2.2 s on 2 cores
    against 0.1 s with them loaded; longer on a loaded node, against a trainer's service timeout):
    loaded before it listens, as a fresh process sees."""
    import subprocess
    import sys

    code = ("import sys; from ddpipe.service import DecodeServer, ServeOptions; "
            "server = DecodeServer(ServeOptions(listen='127.0.0.1:0', workers=1)); "
            "print(sorted(m for m in ('torch', 'ddpipe.decode.output', 'nvidia.dali') if m not in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "[]\n", proc.stdout + proc.stderr


def test_a_server_on_an_ipv6_address_serves(natural: Path) -> None:
    """ZeroMQ takes IPv4 only unless told: `ddpipe serve --listen [::1]:0` said "No such device"."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = start_server(0, host="[::1]")
    try:
        assert server.endpoint.startswith("tcp://[::1]:")
        served = loader(natural, options([server.endpoint]))
        got = epoch(served)
        st = stats(served)
        served.close()
    finally:
        server.stop()
    assert got and st.local_batches == 0 and st.remote_batches == len(got)


def test_float_and_channels_last_outputs_travel_unchanged(natural: Path) -> None:
    extra = {"dtype": "float16", "channels_last": True}
    expected = epoch(loader(natural, DecodeOptions(decoder="dali-cpu", device="cpu", size=24, resize_shorter=28,
                                                    threads=1, **extra)))  # type: ignore[arg-type]
    with servers(1) as (s,):
        got = epoch(loader(natural, DecodeOptions(decoder="dali-cpu", device="cpu", size=24, resize_shorter=28,
                                                  threads=1, service=(s.endpoint,), **extra)))  # type: ignore[arg-type]
    assert same(got, expected)
    assert got[0][0].dtype == torch.float16 and got[0][0].is_contiguous(memory_format=torch.channels_last)


def first_then_rest(ld: ddpipe.Loader, k: int, between: object) -> Batches:
    it: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(ld)
    out = [tuple(t.clone() for t in next(it)) for _ in range(k)]
    between()  # type: ignore[operator]
    out += [(x.clone(), y.clone()) for x, y in it]
    return out  # type: ignore[return-value]


def test_a_server_killed_mid_epoch_loses_nothing(natural: Path) -> None:
    expected = epoch(loader(natural, options()))
    with servers(2) as (a, b):
        served = loader(natural, options([a.endpoint, b.endpoint]))
        got = first_then_rest(served, 2, a.kill)
        st = stats(served)
        served.close()
    assert same(got, expected)
    assert st.by_server.get(b.endpoint, 0) > 0 and st.local_batches == 0


def test_with_every_server_gone_the_trainer_decodes_itself_and_warns_once(natural: Path,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    expected = epoch(loader(natural, options()))
    with servers(1) as (a,):
        served = loader(natural, options([a.endpoint], service_timeout=2.0))
        got = first_then_rest(served, 2, a.kill)
        st = stats(served)
        again = epoch(served, 0)  # a whole epoch with no server at all
        served.close()
    assert same(got, expected) and same(again, expected)
    assert st.local_batches > 0
    assert capfd.readouterr().err.count("no decode server answers") == 1


def test_a_frozen_server_is_dropped_and_its_batches_decoded_elsewhere(natural: Path) -> None:
    import signal

    expected = epoch(loader(natural, options()))
    with servers(2) as (a, b):
        served = loader(natural, options([a.endpoint, b.endpoint], service_timeout=1.5))
        got = first_then_rest(served, 1, lambda: os.kill(a.proc.pid, signal.SIGSTOP))
        st = stats(served)
        served.close()
        os.kill(a.proc.pid, signal.SIGCONT)
    assert same(got, expected)
    assert st.by_server.get(b.endpoint, 0) > 0


def test_a_restarted_server_is_used_again(natural: Path) -> None:
    expected = epoch(loader(natural, options()))
    first = start_server()
    port = first.port
    served = loader(natural, options([first.endpoint], service_timeout=2.0))
    restarted: list[Server] = []
    try:
        got = first_then_rest(served, 1, first.kill)
        assert same(got, expected)
        restarted.append(start_server(port))
        before = stats(served).by_server.get(first.endpoint, 0)
        deadline = time.monotonic() + 120  # a hang bound: reconnecting takes a fraction of a second
        while stats(served).by_server.get(first.endpoint, 0) == before:
            assert time.monotonic() < deadline, "the restarted server was never used"
            assert same(epoch(served, 0), expected)
    finally:
        served.close()
        for s in restarted:
            s.stop()


def test_bad_images_are_named_or_skipped_as_in_local_decoding(tmp_path: Path) -> None:
    from ..decode.images import corrupt_dataset

    root = corrupt_dataset(tmp_path / "bad")
    with servers(1) as (s,):
        with pytest.raises(SampleError) as info:
            list(ddpipe.Loader(root, 4, decode=options([s.endpoint]), shuffle="none"))
        assert info.value.key in ("img/0005", "img/0013") and "shard-00000" in str(info.value)
        local = ddpipe.Loader(root, 4, decode=options(), shuffle="none", on_error="skip")
        served = ddpipe.Loader(root, 4, decode=options([s.endpoint]), shuffle="none", on_error="skip")
        assert same(epoch(served), epoch(local))
        assert served.stats.skipped == local.stats.skipped == 2
        assert sorted(k for k, _, _ in served.stats.skipped_samples) == ["img/0005", "img/0013"]


def dealer(endpoint: str) -> object:
    import zmq

    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)  # a hang bound
    sock.connect(endpoint)
    return sock


def reply(sock: object, frames: list[bytes]) -> dict[str, object]:
    sock.send_multipart(frames)  # type: ignore[attr-defined]
    header: dict[str, object] = msgpack.unpackb(sock.recv_multipart()[0])  # type: ignore[attr-defined]
    return header


def test_garbage_and_other_versions_are_refused_and_the_server_keeps_serving(natural: Path) -> None:
    from ddpipe import __version__

    with servers(1, "--max-request", "1MB") as (s,):
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as raw:  # not even ZeroMQ
            raw.sendall(os.urandom(4096))
        sock = dealer(s.endpoint)
        assert "not a ddpipe message" in str(reply(sock, [b"\xc1garbage"])["error"])
        assert "not a ddpipe message" in str(reply(sock, [msgpack.packb([1, 2, 3])])["error"])
        old = reply(sock, [msgpack.packb({"wire": 1, "ddpipe": "0.0.1", "type": "hello"})])
        assert "0.0.1" in str(old["error"]) and __version__ in str(old["error"])
        lying = wire.decode_message(7, 0, 0, "dali-cpu", options(), [1, 2], ["a", "b"], [0, 0], [b"x"])
        assert "2 indices" in str(reply(sock, lying)["error"])
        oversized = wire.decode_message(8, 0, 0, "dali-cpu", options(), list(range(3)), ["a", "b", "c"], [0] * 3,
                                        [bytes(600_000)] * 3)
        assert "at most" in str(reply(sock, oversized)["error"])
        unknown = wire.decode_message(9, 0, 0, "magic", options(), [0], ["a"], [0], [b"x"])
        assert "decoder 'magic'" in str(reply(sock, unknown)["error"])
        sock.close()  # type: ignore[attr-defined]
        expected = epoch(loader(natural, options()))
        assert same(epoch(loader(natural, options([s.endpoint]))), expected)  # still serving
        assert s.proc.poll() is None


def test_a_client_of_another_version_is_told_both_versions() -> None:
    header = msgpack.packb({"wire": 1, "ddpipe": "9.9.9", "type": "error", "id": None, "error": "x"})
    with pytest.raises(wire.WireError, match=r"9\.9\.9.*" + ddpipe.__version__.replace(".", r"\.")):
        wire.unpack(header)


def test_a_server_survives_its_trainer_and_leaves_nothing_behind(natural: Path) -> None:
    before = set(os.listdir("/dev/shm"))
    expected = epoch(loader(natural, options(decoder="pil")))
    with servers(1) as (s,):
        served = loader(natural, options([s.endpoint], decoder="pil"))
        it = iter(served)
        next(it)  # a trainer that leaves mid-epoch, its batches still in flight
        del it
        served.close()
        assert same(epoch(loader(natural, options([s.endpoint], decoder="pil"))), expected)
        out = s.stop()
    assert s.proc.returncode == 0, out
    assert set(os.listdir("/dev/shm")) <= before


def test_service_options_are_checked() -> None:
    with pytest.raises(ValueError, match="decodes on the CPU"):
        DecodeOptions(decoder="dali-gpu", service=("tcp://x:1",))
    with pytest.raises(ValueError, match="list of addresses"):
        DecodeOptions(service="tcp://x:1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="service_timeout"):
        DecodeOptions(service=("tcp://x:1",), service_timeout=0)
    assert DecodeOptions(service=["tcp://x:1"]).service == ("tcp://x:1",)  # type: ignore[arg-type]
    with pytest.raises(DdpipeError, match="HOST:PORT"):
        from ddpipe.service.transport import endpoint

        endpoint("http://x:1")
    # checked as the options are made, not at the first batch
    for address, says in [("nonsense", "HOST:PORT"), ("tcp://x", "HOST:PORT"), ("tcp://x:65536", "port 65536"),
                          ("x:0", "port 0 is not one to connect to"), ("x:*", "port \\* is not one to connect to")]:
        with pytest.raises(DdpipeError, match=says):
            DecodeOptions(service=(address,))


@pytest.mark.parametrize(("address", "says"), [("nonsense", "nonsense"),
                                               # ZeroMQ took it as port 34463 (99999 modulo 65536)
                                               ("tcp://127.0.0.1:99999", "port 99999 is not one to listen on"),
                                               # ZeroMQ said "No such device"
                                               ("nosuchhost.invalid:5555", "no interface of this machine has"),
                                               ("192.0.2.1:5555", "Cannot assign requested address")])
def test_serve_refuses_a_bad_address_in_one_line(address: str, says: str) -> None:
    from ..conftest import run_cli

    proc = run_cli("serve", "--listen", address, timeout=60)  # a hang bound
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr, proc.stderr


def test_wire_round_trip_keeps_every_byte() -> None:
    images = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
    frames = wire.decoded_message(3, wire.DecodedBatch(images, [(7, "does not decode")], 0.5))
    header = wire.unpack(frames[0])
    back = wire.read_decoded(header, [memoryview(io.BytesIO(bytes(frames[1])).getvalue())])
    assert np.array_equal(back.images, images) and back.bad == [(7, "does not decode")] and back.seconds == 0.5


def servers_decoded(train_output: str) -> tuple[int, int]:
    """The first epoch line's ``decode servers SERVED of BATCHES batches``."""
    said = re.search(r"decode servers (\d+) of (\d+) batches", train_output)
    assert said, train_output
    return int(said[1]), int(said[2])


def test_bench_and_train_take_the_service_and_bench_splits_the_stall(natural: Path) -> None:
    from ..conftest import run_cli

    with servers(1) as (s,):
        bench = run_cli("bench", natural, "--batch-size", "4", "--image-size", "24", "--step-time", "0.001",
                        "--decode", "dali-cpu", "--decode-service", s.endpoint, "--no-progress", timeout=300)
        train = run_cli("train", natural, "--model", "smallcnn", "--batch-size", "4", "--image-size", "24",
                        "--decode-service", s.endpoint, "--log-every", "0", timeout=300)
        log = s.stop()
    assert bench.returncode == 0, bench.stderr
    assert "decode service (1 server(s))" in bench.stdout and "0 here" in bench.stdout
    assert "stall split: fetch" in bench.stdout and "transfer" in bench.stdout
    assert train.returncode == 0, train.stderr
    assert f"on decode servers {s.endpoint}" in train.stdout and "epoch 0:" in train.stdout
    assert "stopped after" in log and "stopped after 0 images" not in log
    served, batches = servers_decoded(train.stdout)
    assert served == batches > 0 and "no decode server answers" not in train.stderr


def test_training_says_each_epoch_how_much_the_servers_decoded(natural: Path) -> None:
    """Servers that never answer (a wrong address, a port closed between the nodes) leave the trainers
    decoding on their own, at their own speed, after one warning among the job's first lines; the
    epoch's line says how much the servers did, here nothing."""
    from ..conftest import run_cli
    from ..storage.servers import free_port

    nobody = f"tcp://127.0.0.1:{free_port()}"
    train = run_cli("train", natural, "--model", "smallcnn", "--batch-size", "4", "--image-size", "24",
                    "--decode-service", nobody, "--log-every", "0", timeout=300)
    assert train.returncode == 0, train.stderr
    assert train.stderr.count(f"no decode server answers ({nobody})") == 1
    served, batches = servers_decoded(train.stdout)
    assert served == 0 and batches > 0
    local = run_cli("train", natural, "--model", "smallcnn", "--batch-size", "4", "--image-size", "24",
                    "--log-every", "0", timeout=300)
    assert local.returncode == 0 and "decode servers" not in local.stdout, local.stderr


def test_resuming_mid_epoch_through_the_service_continues_as_local_decoding(natural: Path) -> None:
    local = loader(natural, options())
    it = iter(local)
    for _ in range(3):
        next(it)
    state = local.state_dict()
    del it
    here = loader(natural, options())
    here.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in here]
    with servers(1) as (s,):
        resumed = loader(natural, options([s.endpoint]))
        resumed.load_state_dict(state)
        got = [(x.clone(), y.clone()) for x, y in resumed]
        assert stats(resumed).remote_batches == len(got) > 0
    assert same(got, rest)
    assert 0 < sum(len(y) for _, y in got) < sum(len(y) for _, y in epoch(local))  # the rest, not a whole epoch


TRAINER = """
import sys, ddpipe
decode = ddpipe.DecodeOptions(decoder="dali-cpu", device="cpu", size=24, resize_shorter=28, dtype="uint8",
                              threads=1, service=(sys.argv[2],))
loader = ddpipe.Loader(sys.argv[1], 4, decode=decode, shuffle="local", seed=5)
for epoch in range(1000):
    loader.set_epoch(epoch)
    for batch in loader:
        print("batch", flush=True)
"""


def test_a_trainer_killed_mid_epoch_leaves_the_server_serving_the_others(natural: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    expected = epoch(loader(natural, options()))
    with servers(1) as (s,):
        trainer = subprocess.Popen([sys.executable, str(script), str(natural), s.endpoint], stdout=subprocess.PIPE,
                                   text=True)
        assert trainer.stdout is not None and trainer.stdout.readline() == "batch\n"  # it is being served
        trainer.kill()
        trainer.wait(timeout=60)
        assert same(epoch(loader(natural, options([s.endpoint]))), expected)
        assert s.proc.poll() is None
