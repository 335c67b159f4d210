"""Locations and S3 settings: pure parsing and resolution, no server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpipe.errors import OptionError
from ddpipe.storage import StorageOptions, parse_location
from ddpipe.storage.settings import resolve_s3

from ..helpers import as_a_user_file_modes_refuse

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=3, max_size=20)


@given(scheme=st.sampled_from(["s3", "http", "https"]), bucket=names, parts=st.lists(names, max_size=3),
       name=names)
def test_a_remote_location_names_its_objects_by_url(scheme: str, bucket: str, parts: list[str], name: str) -> None:
    prefix = "/".join(parts)
    url = f"{scheme}://{bucket}/{prefix}".rstrip("/")
    location = parse_location(url)
    assert location.remote and location.bucket == bucket and location.prefix == prefix
    assert location.url() == (url if prefix else f"{scheme}://{bucket}/")
    assert location.child(name).url() == location.url(name) == f"{scheme}://{bucket}/" + "/".join([*parts, name])
    assert parse_location(location.url(name)) == location.child(name)


def test_paths_stay_paths_and_other_urls_are_refused() -> None:
    assert not parse_location("data/ds").remote and parse_location("file:///data/ds").path == Path("/data/ds")
    assert parse_location(Path("data")).path == Path("data")
    # a key's '..' reached obstore, which raised a ValueError (a traceback) at the first request
    segments = "takes no empty, '.' or '..' segment"
    for bad, what in [("ftp://host/ds", "unsupported scheme"), ("s3:///ds", "no bucket"),
                      ("file://elsewhere/ds", "file:///path"), ("https://host/ds?x=1", "no query"),
                      ("s3://b/../ds", segments), ("s3://b/a//ds", segments), ("https://host/./ds", segments),
                      # obstore's ValueError "empty host", or urllib's, as tracebacks
                      ("https://:80/ds", "https://:80/ds: no host named"),
                      ("http://h:abc/ds", "http://h:abc/ds: not a URL: Port could not be cast"),
                      ("http://[::1/ds", r"http://\[::1/ds: not a URL: Invalid IPv6 URL")]:
        with pytest.raises(OptionError, match=what):
            parse_location(bad)


def test_a_dataset_opens_from_a_file_url_and_another_scheme_is_refused_by_name(tmp_path: Path) -> None:
    """Both were "no such directory": the URL was taken for a directory's name."""
    import ddpipe

    ddpipe.write_dataset(tmp_path / "d", iter([{"__key__": "k", "bin": b"x"}]))
    assert len(ddpipe.open_dataset(f"file://{tmp_path / 'd'}")) == 1
    with pytest.raises(OptionError, match="gs://b/d: unsupported scheme 'gs'"):
        ddpipe.open_dataset("gs://b/d")


def test_s3_settings_come_from_options_then_the_environment_then_the_profile_files(tmp_path: Path) -> None:
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text("[default]\naws_access_key_id = filekey\naws_secret_access_key = filesecret\n"
                                     "[other]\naws_access_key_id = otherkey\naws_secret_access_key = othersecret\n")
    (aws / "config").write_text("[default]\nregion = eu-west-3\n[profile other]\nregion = ap-south-1\n"
                                "endpoint_url = https://store.example\n")
    from_files = resolve_s3(StorageOptions(), {}, tmp_path)
    assert (from_files.access_key_id, from_files.region, from_files.endpoint) == ("filekey", "eu-west-3", None)
    profile = resolve_s3(StorageOptions(), {"AWS_PROFILE": "other"}, tmp_path)
    assert (profile.access_key_id, profile.region, profile.endpoint) == ("otherkey", "ap-south-1",
                                                                        "https://store.example")
    assert not profile.allow_http
    env = {"AWS_ACCESS_KEY_ID": "envkey", "AWS_SECRET_ACCESS_KEY": "envsecret", "AWS_REGION": "us-west-2",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    from_env = resolve_s3(StorageOptions(), env, tmp_path)
    assert (from_env.access_key_id, from_env.region, from_env.endpoint) == ("envkey", "us-west-2",
                                                                           "http://127.0.0.1:9000")
    assert from_env.allow_http  # plain HTTP only because the endpoint says http://
    chosen = resolve_s3(StorageOptions(endpoint="https://minio.site", region="local"), env, tmp_path)
    assert (chosen.endpoint, chosen.region, chosen.allow_http) == ("https://minio.site", "local", False)
    # a profile named but in neither file: its endpoint and keys were passed over without a word (the
    # SDKs refuse it); one in the config file alone is found
    for named in ({"AWS_PROFILE": "typo"}, {"AWS_DEFAULT_PROFILE": "typo"}):
        with pytest.raises(OptionError, match=r"the AWS profile 'typo' \(\$AWS_(DEFAULT_)?PROFILE\) is in neither"):
            resolve_s3(StorageOptions(), {**env, **named}, tmp_path)
    with pytest.raises(OptionError, match=r"'typo' \(StorageOptions.profile\)"):
        resolve_s3(StorageOptions(profile="typo"), env, tmp_path)
    (aws / "config").write_text("[profile site]\nendpoint_url = https://site.example\n")
    assert resolve_s3(StorageOptions(profile="site"), {}, tmp_path).endpoint == "https://site.example"


def test_without_credentials_requests_go_unsigned_only_where_the_metadata_service_is_ruled_out(tmp_path: Path) -> None:
    assert resolve_s3(StorageOptions(), {"AWS_EC2_METADATA_DISABLED": "true"}, tmp_path).anonymous
    assert not resolve_s3(StorageOptions(), {}, tmp_path).anonymous
    with pytest.raises(OptionError, match="one is missing"):
        resolve_s3(StorageOptions(), {"AWS_ACCESS_KEY_ID": "k"}, tmp_path)
    with pytest.raises(OptionError, match="endpoint"):
        StorageOptions(endpoint="minio:9000")
    # obstore's client panicked on each (a Rust panic, "called `Result::unwrap()` on an `Err` value")
    for endpoint in ("http://:9000", "http://minio:port"):
        with pytest.raises(OptionError, match=f"endpoint must be an http:// or https:// URL, not '{endpoint}'"):
            StorageOptions(endpoint=endpoint)
        with pytest.raises(OptionError, match=f"the S3 endpoint must be an http:// or https:// URL, not '{endpoint}'"):
            resolve_s3(StorageOptions(), {"AWS_ENDPOINT_URL": endpoint}, tmp_path)


@pytest.mark.parametrize(("given", "says"), [
    ({"endpoint": 9000}, "endpoint must be text or None, not 9000"),  # was AttributeError 'startswith'
    ({"chunk_bytes": "1KB"}, "chunk_bytes must be at least 64 KiB, not 1000"),  # "8MB" was a TypeError
    ({"concurrency": 2.5}, "concurrency must be a whole number of at least 1, not 2.5"),  # was taken
    ({"max_retries": None}, "max_retries must be a whole number of at least 0, not None"),
    ({"timeout_seconds": "60"}, "timeout_seconds must be a number, not '60'"),
])
def test_storage_options_of_the_wrong_kind_are_refused_naming_the_option(given: dict[str, object], says: str) -> None:
    with pytest.raises(OptionError) as refused:
        StorageOptions(**given)  # type: ignore[arg-type]
    assert str(refused.value) == says
    assert StorageOptions(chunk_bytes="16MB").chunk_bytes == 16_000_000  # type: ignore[arg-type]  # as the CLI says sizes


def test_a_named_settings_file_that_cannot_be_read_is_refused_and_a_default_one_passed_over(tmp_path: Path) -> None:
    """As the SDKs, no file means no settings, and the default files under $HOME are passed over when
    they cannot be opened (a container's $HOME is often another user's). A file the environment names
    that cannot be read (a directory, not text) would have its credentials or endpoint missed without
    a word: it is refused by name."""
    assert resolve_s3(StorageOptions(), {"AWS_CONFIG_FILE": str(tmp_path / "none")}, tmp_path).region == "us-east-1"
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(OptionError, match=f"^{folder}: cannot be read as an AWS settings file: Is a directory$"):
        resolve_s3(StorageOptions(), {"AWS_CONFIG_FILE": str(folder)}, tmp_path)
    (tmp_path / ".aws" / "config").mkdir(parents=True)
    assert resolve_s3(StorageOptions(), {}, tmp_path).region == "us-east-1"
    binary = tmp_path / "credentials"
    binary.write_bytes(b"[default]\naws_access_key_id = \xff\xfe\n")
    with pytest.raises(OptionError, match=f"^{binary}: .* not UTF-8 text$"):
        resolve_s3(StorageOptions(), {"AWS_SHARED_CREDENTIALS_FILE": str(binary)}, tmp_path)


def test_a_home_whose_settings_files_this_user_may_not_open_is_passed_over(tmp_path: Path) -> None:
    """HOME=/root for a process that is not root: the SDKs go on without its files, and so does ddpipe."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text("[default]\nregion = eu-west-3\n")
    home.chmod(0o700)
    (home / ".aws").chmod(0o000)
    code = ("import pathlib, sys; from ddpipe.storage import StorageOptions; "
            "from ddpipe.storage.settings import resolve_s3; "
            "print(resolve_s3(StorageOptions(), {}, pathlib.Path(sys.argv[1])).region)")
    try:
        done = subprocess.run([*as_a_user_file_modes_refuse(), sys.executable, "-c", code, str(home)],
                              capture_output=True, text=True, timeout=60)
    finally:
        (home / ".aws").chmod(0o700)
    assert done.returncode == 0 and done.stdout == "us-east-1\n", done.stdout + done.stderr


def test_no_credentials_and_no_instance_to_ask_is_said_with_what_to_set(tmp_path: Path) -> None:
    """Off the cloud, a client with no credentials asks the instance metadata address for some: its
    refusal was the error, "Error performing PUT http://169.254.169.254/latest/api/token ... 403",
    which names no credential. (obstore's words as this machine's network gives them: no request made.)"""
    from ddpipe.storage import open_storage

    objects = open_storage("s3://bucket/ds", environ={}, home=tmp_path)
    said = objects._failed(RuntimeError("Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/"
                                        "token in 1.8ms - Server returned non-2xx status code: 403 Forbidden"),
                           "index.json")
    assert str(said).startswith("s3://bucket/ds/index.json: no credentials for AWS S3 (us-east-1): none were given "
                                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, StorageOptions) and the "
                                "instance metadata service gave none; for a public bucket set "
                                "AWS_EC2_METADATA_DISABLED=true to send unsigned requests: Generic S3 error"), str(said)
