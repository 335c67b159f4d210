"""Every CLI mistake a user makes gives one line naming the path and what is wrong, and exit 1."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import ddpipe

from .conftest import dir_bytes, run_cli


def one_line(*args: str | Path) -> str:
    proc = run_cli(*args, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddpipe: error: "), proc.stderr
    return lines[0]


def test_paths_that_are_not_what_they_must_be(raw_images: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert str(a_file) in one_line("convert", raw_images, a_file, "--quiet")
    assert one_line("synth", a_file, "--n", "2", "--classes", "2", "--quiet") == \
        f"ddpipe: error: {a_file}: is a file, not a directory: give a new or empty directory"
    msg = one_line("inspect", tmp_path / "nonexistent")
    assert "no such directory" in msg and "nonexistent" in msg
    ddpipe.convert(raw_images, tmp_path / "ds", ddpipe.ConvertOptions(progress=False))
    assert str(a_file) in one_line("stage", tmp_path / "ds", "--local-dir", a_file, "--quiet")
    # as a URL to it is told (it was "not a directory: a dataset is a directory holding index.json")
    assert one_line("inspect", tmp_path / "ds" / "index.json") == f"ddpipe: error: {tmp_path}/ds/index.json: names " \
        f"the index.json itself: a dataset is the directory holding it ({tmp_path}/ds)"


def test_a_directory_with_no_manifest_is_answered_with_the_command_that_makes_one(raw_images: Path,
                                                                                 tmp_path: Path) -> None:
    """A newcomer's first try: training on the folder of images, or on tars from another tool."""
    commands: list[list[str | Path]] = [["train", raw_images, "--model", "smallcnn"], ["inspect", raw_images]]
    for command in commands:
        msg = one_line(*command)
        assert f"{raw_images}/index.json: no index.json" in msg
        assert f"it holds images in class directories: make shards of them with `ddpipe convert {raw_images} " in msg
    assert "nothing to adopt: it holds images in class directories: make shards of them with `ddpipe convert " \
        in one_line("index", raw_images)
    tars = tmp_path / "tars"
    ddpipe.convert(raw_images, tars, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    (tars / "index.json").unlink()
    assert f"it holds tar shards: adopt it in place with `ddpipe index {tars}`" in one_line("train", tars)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "not a ddpipe dataset (try 'ddpipe index' or 'ddpipe convert')" in one_line("inspect", empty)


def test_a_conversion_that_skipped_everything_is_an_error_unless_asked(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(b"not an image")
    msg = one_line("convert", tmp_path / "src", tmp_path / "out", "--on-error", "skip", "--quiet")
    assert "every input was skipped (3)" in msg and not (tmp_path / "out" / "index.json").exists()
    proc = run_cli("convert", tmp_path / "src", tmp_path / "out", "--on-error", "skip", "--allow-empty", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "holds no samples" in one_line("train", tmp_path / "out", "--model", "smallcnn")


def test_verify_checks_a_staging_directory(raw_images: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    ddpipe.convert(raw_images, ds, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    stage = tmp_path / "stage"
    list(ddpipe.EncodedStream(ds, 4, stage_dir=stage))
    assert run_cli("verify", ds, "--stage-dir", stage, "--quiet").returncode == 0
    copies = next(stage.glob("ddpipe-*"))
    for given in (stage, copies):  # given in the dataset's place, it was "not a ddpipe dataset", or for the
        # copies, "adopt it in place with `ddpipe index`": a manifest written among the staged copies
        assert one_line("verify", given) == f"ddpipe: error: {given}/index.json: no index.json: it is a staging " \
            f"directory (node-local copies of a dataset's shards): check them with `ddpipe verify DATASET " \
            f"--stage-dir {stage}`"
    copy = next(stage.rglob("shard-000001.tar"))
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 1
    copy.write_bytes(bytes(data))
    proc = run_cli("verify", ds, "--stage-dir", stage, "--quiet")
    assert proc.returncode == 1 and str(copy) in proc.stderr and "checksum mismatch" in proc.stderr


def test_verify_checks_every_nodes_staging_directory_by_the_jobs_name_for_it(raw_images: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    ddpipe.convert(raw_images, ds, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    template = str(tmp_path / "stage-{node}")
    list(ddpipe.EncodedStream(ds, 4, stage_dir=template))  # one process: node 0
    shutil.copytree(tmp_path / "stage-0", tmp_path / "stage-1")  # as node 1 of a job would have left it
    staged = len(list((tmp_path / "stage-0").rglob("shard-*.tar")))
    copy = next((tmp_path / "stage-1").rglob("shard-000001.tar"))
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 1
    copy.write_bytes(bytes(data))
    proc = run_cli("verify", ds, "--stage-dir", template, "--quiet")
    assert proc.returncode == 1 and f"{copy}: checksum mismatch" in proc.stderr, proc.stderr
    assert f"FAILED (1 problem(s)): {2 * staged} shards" in proc.stdout
    proc = run_cli("verify", ds, "--stage-dir", tmp_path / "none-{node}", "--quiet")
    assert proc.returncode == 1 and "none-{node}: nothing of this dataset is staged there" in proc.stderr


def test_indexing_again_keeps_the_class_names(raw_images: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    ddpipe.convert(raw_images, ds, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    names = ddpipe.load_manifest(ds).classes
    assert names and not names[0].isdigit()
    (ds / "index.json").unlink()
    (tmp_path / "names.txt").write_text("\n".join(names))
    assert run_cli("index", ds, "--classes", tmp_path / "names.txt").returncode == 0
    assert run_cli("index", ds).returncode == 0  # again, without --classes
    assert ddpipe.load_manifest(ds).classes == names


def test_training_and_bench_mistakes_are_one_line_before_any_work(raw_images: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    ddpipe.convert(raw_images, ds, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    small = ("--model", "smallcnn", "--image-size", "16")
    not_a_checkpoint = tmp_path / "junk.ckpt"
    not_a_checkpoint.write_text("x")
    msg = one_line("train", ds, *small, "--batch-size", "4", "--checkpoint", not_a_checkpoint)
    assert str(not_a_checkpoint) in msg and "not a checkpoint" in msg
    msg = one_line("train", ds, *small, "--batch-size", "100")  # 24 samples: no full batch of 100
    assert "--batch-size 100 is more than a rank's share" in msg
    assert f"{tmp_path}: is a directory: give --checkpoint a file's name" in one_line(
        "train", ds, *small, "--checkpoint", tmp_path)
    assert "/missing-dir: the directory for --checkpoint" in one_line(
        "train", ds, *small, "--checkpoint", tmp_path / "missing-dir" / "x.ckpt")
    assert "device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (a GPU's index), not 'tpu'" in one_line(
        "train", ds, *small, "--device", "tpu")  # was torch's RuntimeError, a traceback
    assert "decode='dali-gpu' needs a CUDA device" in one_line(  # was after the banner, at the first batch
        "train", ds, *small, "--decode", "dali-gpu", "--device", "cpu")
    assert "/missing-dir: the directory for --plot" in one_line("bench", ds, "--plot",
                                                                 tmp_path / "missing-dir" / "p.png")
    (tmp_path / "a-file").write_text("x")  # was "the directory for --plot does not exist"
    assert f"{tmp_path}/a-file: not a directory: --plot cannot be written under it" in one_line(
        "bench", ds, "--plot", tmp_path / "a-file" / "p.png")
    assert one_line("bench", ds, "--compare", "torch", "--compare-dir", tmp_path / "a-file") == f"ddpipe: error: " \
        f"{tmp_path}/a-file: is not a directory: --compare-dir names one under which the peers' inputs are written"
    proc = run_cli("bench", ds, "--step-time", "-1")
    assert proc.returncode == 2 and "--step-time: must be 0 or more seconds" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_shows_defaults_and_unknown_loader_keywords_list_the_known(tmp_path: Path) -> None:
    import pytest

    assert "(default: 0.05)" in run_cli("bench", "--help").stdout.replace("\n", " ")
    # no default shown where there is none, nor a second one where the help names it already
    convert_help = " ".join(run_cli("convert", "--help").stdout.split())
    assert "(default: None)" not in convert_help and "(default: False)" not in convert_help
    assert "e.g. 256MB (default) --samples-per-shard" in convert_help
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: sizes; its keywords are .*shuffle"):
        ddpipe.Loader(tmp_path, 4, sizes=3)  # type: ignore[call-arg]



def _help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from ddpipe.cli.parser import parse_command_line

    with pytest.raises(SystemExit) as stop:
        parse_command_line([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_every_argument_of_every_command_says_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """A newcomer reads ``--help``: an option listed bare (``--exchange-fraction EXCHANGE_FRACTION`` and
    nothing more) sends them to the source. An argument's entry is its line (two spaces in) and the lines
    indented further below it; its help is whatever follows its name there."""
    commands = re.search(r"\{([a-z,]+)\}", _help_of(capsys)).group(1).split(",")  # type: ignore[union-attr]
    assert {"convert", "train", "bench", "serve"} <= set(commands)
    bare = []
    for command in commands:
        text = _help_of(capsys, command)
        assert "(default: [])" not in text and "(default: None)" not in text, command
        entries: list[list[str]] = []
        for line in text.split("\n\n", 1)[1].splitlines():  # past the usage
            if re.match(r"^  \S", line):
                entries.append([line])
            elif re.match(r"^   +\S", line) and entries:
                entries[-1].append(line)
            elif entries and entries[-1]:  # a section heading or a blank line ends an entry
                entries.append([])
        for entry in filter(None, entries):
            name = entry[0].split()[0].rstrip(",")
            said = re.split(r"\s{2,}", entry[0].strip(), maxsplit=1)[1:] + entry[1:]
            if name not in ("-h", "--help") and not " ".join(said).strip():
                bare.append(f"{command} {name}")
    assert not bare, f"arguments with no help: {', '.join(bare)}"


def test_an_option_a_command_does_not_take_is_that_commands_error(tmp_path: Path) -> None:
    proc = run_cli("convert", tmp_path, tmp_path / "out", "--shard-bytes", "3MB")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # the command's own usage, which lists what it takes (--shard-size), not the list of commands
    assert "ddpipe convert: error: unrecognized arguments: --shard-bytes 3MB" in proc.stderr
    assert "usage: ddpipe convert" in proc.stderr and "--shard-size" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["train", "ds", "--lr", "-1"], "argument --lr: must be more than 0, not -1"),
    (["train", "ds", "--lr", "nan"], "argument --lr: must be a finite number, not nan"),
    (["train", "ds", "--lr", "0"], "argument --lr: must be more than 0"),
    (["train", "ds", "--warmup-epochs", "-2"], "argument --warmup-epochs: must be 0 or more"),
    (["bench", "ds", "--decode-rate", "inf"], "argument --decode-rate: must be a finite number"),
    (["bench", "ds", "--project", "nodes=8", "--decode-rate", "0"],  # was taken for none: the rate measured here
     "argument --decode-rate: must be more than 0, not 0"),
    (["bench", "ds", "--link-latency", "-1"], "argument --link-latency: must be 0 or more seconds"),
    (["bench", "ds", "--step-time", "inf"], "--step-time: must be 0 or more seconds, a finite number, not inf"),
    (["serve", "--log-every", "0"], "argument --log-every: must be more than 0"),
    (["synth", "out", "--quality", "101"], "argument --quality: must be 1 to 100, not 101"),  # was written as 100
    (["synth", "out", "--n", "x"], "argument --n: not a whole number: 'x'"),  # was "invalid _positive value"
    # read after the benchmark had run: a traceback (nodes=abc), or a table of -1 nodes
    (["bench", "ds", "--project", "nodes=abc"], "argument --project: give node counts as nodes=1,8,64"),
    (["bench", "ds", "--project", "nodes=0"], "argument --project: give node counts of at least 1"),
    (["bench", "ds", "--project", "nodes=8,-1"], "argument --project: give node counts of at least 1"),
    (["bench", "ds", "--gpus-per-node", "0"], "argument --gpus-per-node: must be at least 1"),
    (["plan", "ds", "-W", "4", "--within", "nan"], "argument --within: must be a share of the gap, in [0, 1]"),
    (["plan", "ds", "-W", "4", "--within", "-1"], "argument --within: must be a share of the gap"),  # "200% of"
    # refused deep in the options, naming their Python names and every other bound at once
    # ("epochs, reference_batch and bucket_bytes must be at least 1; checkpoint_every, ...")
    (["train", "ds", "--checkpoint-every", "-1"], "argument --checkpoint-every: must be 0 or more, not -1"),
    (["train", "ds", "--image-size", "0"], "argument --image-size: must be at least 1"),  # "size must be positive"
    # refused once the job had started, in DecodeOptions' words ("size 100000 makes images ... max_pixels")
    (["train", "ds", "--image-size", "100000"], "argument --image-size: must be at most 9459, not 100000"),
    (["bench", "ds", "--image-size", "9460"], "argument --image-size: must be at most 9459, not 9460"),
    (["train", "ds", "--exchange-fraction", "1.5"], "argument --exchange-fraction: must be in [0, 1], not 1.5"),
    (["bench", "ds", "--exchange-fraction", "nan"], "argument --exchange-fraction: must be a finite number"),
    (["plan", "ds", "-W", "2", "--buffer-size", "-1"], "argument --buffer-size: must be 0 or more, not -1"),
    (["plan", "ds", "-W", "0"], "argument --world-size/-W: must be at least 1"),
    (["serve", "--queue", "-1"], "argument --queue: must be 0 or more, not -1"),
    (["convert", "src", "out", "--shard-size", "inf"], "argument --shard-size: size 'inf' is not a number of bytes"),
    # the job's error once launched, after the banner (exit 1): a usage error before anything starts
    (["train", "ds", "--model", "resnet999"], "argument --model: unknown model 'resnet999': choose resnet18, "
     "resnet34, resnet50, resnet101 or smallcnn"),
    (["bench", "ds", "--model", "tiny"], "argument --model: unknown model 'tiny': choose resnet18"),
    (["train", "ds", "--num-classes", "0"], "argument --num-classes: must be at least 1"),  # was taken
    # bench raised a traceback (twice) once it had started; stage said "source_limits: ..."
    (["bench", "ds", "--source-throttle", "fast"], "argument --source-throttle: cannot parse 'fast' in 'fast'"),
    (["stage", "ds", "--local-dir", "x", "--source-throttle", "100MB,5ms"],
     "argument --source-throttle: cannot parse '100MB' in '100MB,5ms': use e.g. '100MB/s,5ms'"),
    # matplotlib's traceback once the benchmark had run ("Format 'txt' is not supported"); a name
    # without a suffix was written with .png added, and "wrote plot" named no file
    (["bench", "ds", "--plot", "plot.txt"], "argument --plot: plot.txt: name a file ending .png, .svg or .pdf"),
    (["bench", "ds", "--plot", "plot"], "argument --plot: plot: name a file ending .png, .svg or .pdf"),
    # Path("s3://b/x") is "s3:/b/x": a stage, a report, a checkpoint's directory... made here under that name
    (["train", "ds", "--checkpoint", "s3://b/c.pt"],
     "argument --checkpoint: s3://b/c.pt: takes a path on this machine, not an object store's URL"),
    (["stage", "ds", "--local-dir", "s3://b/x"], "argument --local-dir: s3://b/x: takes a path on this machine"),
    (["bench", "ds", "--json", "https://h/x.json"], "argument --json: https://h/x.json: takes a path on this machine"),
    (["index", "tars", "--out", "s3://b/m"], "argument --out: s3://b/m: takes a path on this machine"),
    (["synth", "s3://b/raw"], "argument out: s3://b/raw: takes a path on this machine"),
    # Path("") is ".": the working directory was staged into, converted as an ImageFolder, read as a dataset
    (["train", "ds", "--stage-dir", ""], "argument --stage-dir: an empty path (a variable not set?)"),
    (["convert", "", "out"], "argument src: an empty path (a variable not set?)"),
    (["inspect", ""], "argument dataset: an empty path (a variable not set?)"),
    (["bench", "ds", "--source-throttle", ".ms"],  # a latency without digits: was float's own words
     "argument --source-throttle: cannot parse '.ms' in '.ms': use e.g. '100MB/s,5ms'"),
    # an option that acts only with another: passed over in silence, or "stage_dir=None stages nothing"
    (["train", "ds", "--checkpoint-every", "5"], "argument --checkpoint-every: takes effect only with --checkpoint"),
    (["train", "ds", "--stage-capacity", "1GB"], "argument --stage-capacity: takes effect only with --stage-dir"),
    (["convert", "src", "out", "--synsets", "map.txt"], "argument --synsets: takes effect only with --val-labels"),
    (["bench", "ds", "--compare-dir", "peers"], "argument --compare-dir: takes effect only with --compare"),
    (["bench", "ds", "--gpus-per-node", "8"], "argument --gpus-per-node: takes effect only with --project"),
    (["bench", "ds", "--fs-bandwidth", "1GB"], "argument --fs-bandwidth: takes effect only with --project"),
    (["train", "ds", "--shuffle", "local", "--exchange-fraction", "0.5"],
     "argument --exchange-fraction: takes effect only with --shuffle partial"),
    (["bench", "ds", "--shuffle", "global", "--exchange-fraction", "0.1"],
     "argument --exchange-fraction: takes effect only with --shuffle partial"),
    (["train", "ds", "--decode-service", ","],  # no server: it decoded here without a word
     "argument --decode-service: no server address in ',': give HOST:PORT[,HOST:PORT...]"),
    # the library's refusal named its own option (read_in='process'), after the training banner
    (["train", "ds", "--read-in", "process", "--decode", "pil"],
     "argument --read-in: process prepares batches for a DALI decoder in this process: not with --decode pil"),
    (["bench", "ds", "--read-in", "process", "--decode-service", "tcp://cpu-1:5555"],
     "argument --read-in: process prepares batches for a DALI decoder in this process: not with --decode-service"),
])
def test_a_number_an_argument_cannot_take_is_one_usage_error(args: list[str], says: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A negative or non-finite learning rate reached torch's SGD, which raised a traceback (--lr -1),
    or trained on NaN without a word (--lr nan)."""
    from ddpipe.cli.parser import parse_command_line

    with pytest.raises(SystemExit) as ended:
        parse_command_line(args)
    assert ended.value.code == 2 and says in capsys.readouterr().err


def test_options_that_act_together_are_taken_together_and_the_version_is_said() -> None:
    from ddpipe import __version__
    from ddpipe.cli.parser import parse_command_line

    args = parse_command_line(["train", "ds", "--checkpoint", "c.pt", "--checkpoint-every", "5", "--stage-dir", "s",
                               "--stage-capacity", "1GB"])
    assert (args.checkpoint_every, args.stage_capacity) == (5, 10**9)
    val = parse_command_line(["convert", "src", "out", "--val-labels", "v.csv", "--synsets", "m.txt"])
    assert val.synsets == "m.txt"
    bench = parse_command_line(["bench", "ds", "--compare", "--compare-dir", "p", "--project", "nodes=8",
                                "--gpus-per-node", "8", "--decode-rate", "500"])
    assert (bench.compare, bench.compare_dir, bench.gpus_per_node, bench.decode_rate) == ([], "p", 8, 500.0)
    partial = parse_command_line(["train", "ds", "--exchange-fraction", "0.5"])  # partial is the default shuffle
    assert (partial.shuffle, partial.exchange_fraction) == ("partial", 0.5)
    proc = run_cli("--version", check=True)
    assert proc.stdout == f"ddpipe {__version__}\n"


def test_a_slow_source_model_from_the_environment_is_named_where_it_is_wrong(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ddpipe.cli.parser import parse_command_line
    from ddpipe.throttle import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "bogus")
    with pytest.raises(SystemExit) as ended:
        parse_command_line(["bench", "ds"])
    assert ended.value.code == 2
    assert f"argument --source-throttle: cannot parse 'bogus' in 'bogus': use e.g. '100MB/s,5ms' (the value of " \
           f"${ENV_VAR})" in capsys.readouterr().err
    given = parse_command_line(["bench", "ds", "--source-throttle", "1GB/s,2ms"])  # the option, not the variable
    assert given.source_throttle == "1GB/s,2ms"


def test_a_negative_seed_is_a_seed_for_every_command(raw_images: Path, tmp_path: Path) -> None:
    """The Loader takes any integer; ddpipe synth and ddpipe convert --seed gave numpy's "expected
    non-negative integer" as a traceback. The seed decides, the same on every run."""
    made = [run_cli("synth", tmp_path / f"s{k}", "--n", "3", "--classes", "3", "--seed", "-1") for k in (1, 2)]
    assert all(p.returncode == 0 for p in made), made[0].stderr
    assert dir_bytes(tmp_path / "s1") == dir_bytes(tmp_path / "s2")
    orders = []
    for k in (1, 2):
        proc = run_cli("convert", raw_images, tmp_path / f"c{k}", "--seed", "-5", "--quiet")
        assert proc.returncode == 0, proc.stderr
        orders.append([s["__key__"] for s in ddpipe.open_dataset(tmp_path / f"c{k}")])
    assert orders[0] == orders[1] and orders[0] != sorted(orders[0])


def test_a_checkpoint_that_could_not_be_written_is_refused_before_training(raw_images: Path, tmp_path: Path) -> None:
    """In a directory the user may not write to, it was found at the end of the first epoch, the epoch
    lost. Run as a user file modes refuse (root, without its override of them)."""
    import sys

    from .conftest import launch
    from .helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    ds = tmp_path / "ds"
    ddpipe.convert(raw_images, ds, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc = launch([*as_user, sys.executable, "-m", "ddpipe", "train", str(ds), "--model", "smallcnn",
                       "--image-size", "16", "--batch-size", "4", "--checkpoint", str(locked / "ck.pt")],
                      timeout=120)  # a hang bound
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "epoch 0" not in proc.stdout, proc.stderr
    assert f"{locked}: the directory for --checkpoint cannot be written to: Permission denied" in proc.stderr
    assert list(locked.iterdir()) == []


def test_a_checkpoint_in_a_directory_that_takes_no_files_is_refused_in_those_words(raw_images: Path,
                                                                                   tmp_path: Path) -> None:
    """/proc answers a new file with "No such file or directory": the refusal said the directory cannot
    be written to "No such file or directory", of a directory that is there."""
    ds = tmp_path / "ds"
    ddpipe.convert(raw_images, ds, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    proc = run_cli("train", ds, "--model", "smallcnn", "--image-size", "16", "--checkpoint", "/proc/ck.pt")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "/proc: the directory for --checkpoint cannot be written to: it takes no new files" in proc.stderr


def test_a_tilde_the_shell_left_is_the_home_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The shell expands ``~`` only at a word's start and unquoted: ``--local-dir=~/stage`` came to ddpipe
    as it is and made a directory named ``~`` in the working directory. Every path a command takes is
    expanded as the shell would."""
    from ddpipe.cli.parser import parse_command_line

    monkeypatch.setenv("HOME", str(tmp_path))
    given = {
        ("synth", "~/o"): ["out"],
        ("convert", "~/s", "~/o", "--val-labels=~/v", "--synsets=~/y"): ["src", "out", "val_labels", "synsets"],
        ("index", "~/d", "--classes=~/c", "--out=~/o", "--labels-file=~/l"): ["dir", "classes", "out", "labels_file"],
        ("plan", "~/d", "-W", "8"): ["dataset"],
        ("stage", "~/d", "--local-dir=~/l"): ["dataset", "local_dir"],
        ("train", "~/d", "--eval=~/e", "--stage-dir=~/s", "--checkpoint=~/c"): ["dataset", "eval", "stage_dir",
                                                                                "checkpoint"],
        ("bench", "~/d", "--compare", "--compare-dir=~/c", "--stage-dir=~/s", "--json=~/j", "--plot=~/p.png"): [
            "dataset", "compare_dir", "stage_dir", "json", "plot"],
        ("inspect", "~/d"): ["dataset"],
        ("verify", "~/d", "--stage-dir=~/s"): ["dataset", "stage_dir"],
    }
    for argv, paths in given.items():
        args = vars(parse_command_line(argv))
        for name in paths:
            assert str(args[name]).startswith(f"{tmp_path}/"), (argv, name, args[name])
    assert parse_command_line(["inspect", "s3://b/~d"]).dataset == "s3://b/~d"  # a URL is left as it is


def test_a_tilde_in_an_option_stages_under_home_not_in_the_working_directory(
        raw_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ddpipe.convert(raw_images, tmp_path / "ds", ddpipe.ConvertOptions(progress=False))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    proc = run_cli("stage", tmp_path / "ds", "--local-dir=~/stage", "--quiet", cwd=tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "work").iterdir()) == []
    assert list((tmp_path / "home" / "stage").rglob("*.tar"))
