"""Where ddpipe's dali-gpu path loses time, each piece alone: ``python benchmarks/gpu.py --probe``.

DALI graphs fed from memory as ddpipe feeds them, one thing changed in each; the Loader's encoded
stream and its reads alone; the Loader read in a process with DALI given fewer threads than the
machine's cores; ddpipe's DALI decoder fed from memory, first epoch and later ones; the Loader as it
is, read in a process (DALI's prefetch queue at 2 and at 3), and under a shorter interpreter switch
interval; and a profile of the Loader's threads.
Prints; records nothing (the figures worth keeping go through benchmarks/gpu.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from gpu_timing import BATCH, CORES, SIZE, epoch_rates

from ddpipe.bench.harness import median
from ddpipe.reading import read_samples


def probe(root: Path, epochs: int) -> None:
    """DALI graphs fed from memory as ddpipe feeds them (the crop windows, flips and labels as inputs),
    with one thing changed each, against DALI's own random crop; then the Loader's encoded stream
    alone, and a profile of the Loader's own epoch (what its calling thread spends time on)."""
    import cProfile
    import pstats

    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types

    import ddpipe
    from ddpipe.decode import DecodeOptions
    from ddpipe.decode.augment import image_size, random_crops
    from ddpipe.decode.dali import DaliDecoder

    samples = [s for b in ddpipe.EncodedStream(root, BATCH, shuffle="none") for s in b][: 16 * BATCH]
    wh = np.array([image_size(s["jpg"]) for s in samples])
    crops = random_crops(0, 0, np.arange(len(samples)), wh[:, 0], wh[:, 1], DecodeOptions())
    start = np.stack([crops.left, crops.top], 1).astype(np.int32)
    shape = np.stack([crops.width, crops.height], 1).astype(np.int32)
    n = len(samples) // BATCH
    feed = [([np.frombuffer(s["jpg"], np.uint8) for s in samples[b * BATCH : (b + 1) * BATCH]],
             list(start[b * BATCH : (b + 1) * BATCH]), list(shape[b * BATCH : (b + 1) * BATCH])) for b in range(n)]

    def rate(name: str, decode: Any, dynamic: bool = True, depth: int = 2) -> None:
        @pipeline_def(batch_size=BATCH, num_threads=CORES, device_id=0, prefetch_queue_depth=depth,
                      exec_dynamic=dynamic)
        def pipe():  # type: ignore[no-untyped-def]
            enc, st, sh = fn.external_source(source=feed, num_outputs=3, cycle=True,
                                              dtype=[types.UINT8, types.INT32, types.INT32])
            img = fn.resize(decode(enc, st, sh), resize_x=SIZE, resize_y=SIZE, antialias=True)
            return fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW")

        p = pipe()
        p.build()
        rates = []
        for _ in range(epochs):
            t0 = time.perf_counter()
            for _ in range(n):
                p.run()
            torch.cuda.synchronize()
            rates.append(n * BATCH / (time.perf_counter() - t0))
        print(f"{name}: {median(rates[1:]):.0f} img/s", flush=True)

    def sliced(enc: Any, st: Any, sh: Any, **kw: Any) -> Any:
        return fn.decoders.image_slice(enc, device="mixed", output_type=types.RGB, start=st, shape=sh,
                                       axis_names="WH", **kw)

    # one graph at a time: the rates of two runs of this probe differed by up to a fifth, and four of these
    # graphs run in turn in one process (image_slice, image_random_crop, full decode) gave the same rates
    # within that, whichever ran first: the order of the lines here is not a ranking
    rate("image_slice (ddpipe's graph)", lambda e, s, h: sliced(e, s, h, adjust_orientation=False))
    # the decoder's whole graph (its columns of numbers, flips, labels to the device, its output type) fed
    # batches it prepared before, from a list: against the line above, what the rest of the graph costs;
    # against "DaliDecoder fed from memory" below, what its feed's thread and the hand-over to torch cost
    in_memory = [(np.arange(b * BATCH, (b + 1) * BATCH), samples[b * BATCH : (b + 1) * BATCH]) for b in range(n)]
    decoder = DaliDecoder(DecodeOptions(threads=CORES), BATCH, torch.device("cuda"), gpu_decode=True)
    print(f"DaliDecoder's graph fed prepared batches: {median(graph_rates(decoder, in_memory, epochs)):.0f} img/s",
          flush=True)
    rate("image_random_crop (DALI's own)", lambda e, s, h: fn.decoders.image_random_crop(
        e, device="mixed", output_type=types.RGB, random_area=[0.08, 1.0]))
    encoded = ddpipe.EncodedStream(root, BATCH, shuffle="local")
    encoded.views = True  # as the Loader reads for DALI: samples in place, not copied out (an H200 run without
    # this timed the copies, 26,000 samples/s, for a stream that gives DALI views)
    for _ in range(2):
        t0 = time.perf_counter()
        k = sum(len(b) for b in encoded)
    print(f"Loader, encoded samples only (local, views): {k / (time.perf_counter() - t0):.0f} samples/s",
          flush=True)
    # the host side alone, on this machine's cores (benchmarks/feed.py): the Loader feeding a DALI graph that
    # decodes nothing; where it runs below DALI's own rate, the host cannot keep the GPU busy
    from feed_runs import loader_decoding_nothing

    loader = loader_decoding_nothing(root)
    rates = epoch_rates(lambda ld=loader: (y for _, y in ld), epochs)
    print(f"Loader, feed of the dali-gpu path, graph decoding nothing: {median(rates):.0f} samples/s", flush=True)
    # each part above keeps up alone (e51d624: the graph at DALI's own rate, the feed well ahead of it) and
    # together they do not. DALI's mixed decoder decodes part of each batch on its CPU threads, one a core by
    # default, beside the reading process and the feed's threads: whether the cores are what they share
    for threads in (CORES, CORES - 2, CORES // 2):
        loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local", read_in="process",
                               threads=threads)
        rates = epoch_rates(lambda ld=loader: (x for x, _ in ld), epochs)
        print(f"Loader, dali-gpu (local), read in a process, {threads} DALI threads: {median(rates):.0f} img/s",
              flush=True)
        loader.close()
    # the reading alone, with each sample copied out of its shard (what decode="none" gives) and as
    # views of the shard (what DALI's decoders get)
    everything = np.arange(len(encoded.dataset))
    for views in (False, True):
        t0 = time.perf_counter()
        k = sum(1 for _ in read_samples(encoded.dataset, everything, views=views))
        print(f"Dataset.read, {'views' if views else 'copies'}: {k / (time.perf_counter() - t0):.0f} samples/s",
              flush=True)
    # ddpipe's own decoder (its feed, crop windows, graph and hand-over to torch) without the Loader's
    # threads: between the graph alone, above, and the Loader, below
    # its first epoch builds its pipeline (the nvImageCodec decoders, the hardware decoder, buffers grown
    # over the first batches); later epochs reset it: a pipeline built each epoch cost that every epoch
    first, *later = decoder_from_memory(in_memory, epochs)
    print(f"DaliDecoder fed from memory: first epoch {first:.0f} img/s, later {median(later):.0f} img/s",
          flush=True)
    # the Loader as it is (its threads); then its batches read and prepared in a process of their own (what is
    # left here is wrapping them for DALI), and with one batch more in DALI's prefetch queue (the graph alone
    # ran faster at 3 than at 2 in one run, slower in the next); these before the DALI knobs, at the end
    loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local")
    rates = epoch_rates(lambda ld=loader: (x for x, _ in ld), epochs)
    default_interval = sys.getswitchinterval()
    print(f"Loader, dali-gpu (local), switch interval {default_interval * 1e3:g} ms: {median(rates):.0f} img/s",
          flush=True)
    loader.close()
    for depth in (DaliDecoder.QUEUE_DEPTH, 3):
        loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local", read_in="process")
        decoder = DaliDecoder(loader.decoding.options, BATCH, torch.device("cuda"), gpu_decode=True)
        decoder.QUEUE_DEPTH = depth
        loader.decoding._decoder = decoder  # the stage's decoder, before its first epoch makes one
        rates = epoch_rates(lambda ld=loader: (x for x, _ in ld), epochs)
        print(f"Loader, dali-gpu (local), read in a process, prefetch queue {depth}: {median(rates):.0f} img/s",
              flush=True)
        loader.close()
    # the calling thread takes the interpreter lock back after each wait in DALI or CUDA; a thread that
    # holds it (the Loader's reader) gives it up only every switch interval (5 ms by default)
    sys.setswitchinterval(1e-4)
    loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local")
    rates = epoch_rates(lambda ld=loader: (x for x, _ in ld), epochs)
    print(f"Loader, dali-gpu (local), switch interval 0.1 ms: {median(rates):.0f} img/s", flush=True)
    loader.close()
    sys.setswitchinterval(default_interval)
    loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local")
    list(loader)
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    k = sum(len(y) for _, y in loader)
    profile.disable()
    torch.cuda.synchronize()
    print(f"Loader, dali-gpu (local), profiled: {k / (time.perf_counter() - t0):.0f} img/s", flush=True)
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    # last, should the probe's time run out: the DALI knobs each run before (the same graph alone, one thing
    # changed), whose rates have moved within the spread of runs
    rate("image_slice, static executor", lambda e, s, h: sliced(e, s, h, adjust_orientation=False), dynamic=False)
    # a deeper prefetch queue (ddpipe's is 2; NVIDIA names a queue of 1 among the causes of a slow
    # external-source pipeline): whether one more batch in flight buys anything on this GPU
    for depth in (1, 3):
        rate(f"image_slice, prefetch queue {depth}", lambda e, s, h: sliced(e, s, h, adjust_orientation=False),
             depth=depth)
    # every image to the hardware decoder: no faster beyond that noise, and a corrupt image then came out
    # as pixels instead of an error (tests/decode's bad-image test on the GPU): not ddpipe's setting
    rate("image_slice, hw_decoder_load=1", lambda e, s, h: sliced(e, s, h, hw_decoder_load=1.0))
    # the hardware decoder kept out: where ddpipe's graph runs at this rate, it is not getting it
    rate("image_slice, hw_decoder_load=0", lambda e, s, h: sliced(e, s, h, hw_decoder_load=0.0))
    rate("full decode, then slice on the GPU", lambda e, s, h: fn.slice(
        fn.decoders.image(e, device="mixed", output_type=types.RGB), s, h, axis_names="WH"))
    rate("image_random_crop, hw_decoder_load=0", lambda e, s, h: fn.decoders.image_random_crop(
        e, device="mixed", output_type=types.RGB, random_area=[0.08, 1.0], hw_decoder_load=0.0))


def graph_rates(decoder: Any, batches: list[tuple[Any, list[Any]]], epochs: int) -> list[float]:
    """Images/s of ``decoder``'s DALI graph alone, each epoch after the first: fed ``(indices, samples)``
    batches its feed prepared before the clock starts (headers, crops, the arrays DALI reads), from a
    list, DALI's outputs left to DALI (no feed thread, no hand-over to torch)."""
    from ddpipe.decode.batches import EncodedBatch

    def on_bad(index: int, sample: Any, reason: str) -> None:
        raise RuntimeError(f"sample {index}: {reason}")

    feed = decoder._feed
    feed._seed, feed._epoch, feed._on_bad = 0, 1, on_bad
    prepared = [feed._prepared(EncodedBatch.of(indices, samples, on_bad)).fed for indices, samples in batches]

    class Listed:  # the external source: the prepared batches, afresh each epoch (after a reset)
        def __iter__(self) -> Any:
            return iter(prepared)

    decoder._feed, rates = Listed(), []
    try:
        pipe = decoder._pipeline()
        for epoch in range(epochs):
            if epoch:
                pipe.reset()
            t0 = time.perf_counter()
            k = 0
            try:
                while True:
                    images, _ = pipe.run()
                    k += len(images)
            except StopIteration:
                pass
            if decoder.gpu_decode:
                import torch

                torch.cuda.synchronize()
            rates.append(k / (time.perf_counter() - t0))
    finally:
        decoder._feed = feed
        decoder.close()
    return rates[1:]


def decoder_from_memory(batches: list[tuple[Any, list[Any]]], epochs: int) -> list[float]:
    """Images/s of ddpipe's DALI decoder alone (``mixed``, the training transform, the hand-over to torch)
    over encoded ``(indices, samples)`` batches held in memory, each epoch, the first (which builds its
    pipeline) included."""
    import torch

    from ddpipe.decode import DecodeOptions
    from ddpipe.decode.batches import EncodedBatch
    from ddpipe.decode.dali import DaliDecoder

    def on_bad(index: int, sample: Any, reason: str) -> None:
        raise RuntimeError(f"sample {index}: {reason}")

    decoder = DaliDecoder(DecodeOptions(threads=CORES), BATCH, torch.device("cuda"), gpu_decode=True)
    epoch = [0]

    def decoded():  # type: ignore[no-untyped-def]
        encoded = (EncodedBatch.of(indices, samples, on_bad) for indices, samples in batches)
        epoch[0] += 1
        return (images for images, _ in decoder.decode(encoded, 0, epoch[0], on_bad))

    try:
        return epoch_rates(decoded, epochs, first=True)
    finally:
        decoder.close()


# ---- the harness ------------------------------------------------------------------------------
