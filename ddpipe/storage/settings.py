"""How to reach an object store, resolved once at the edge from options, the environment and the AWS
files, as the AWS SDKs resolve them: explicit options first, then ``AWS_*`` variables, then the
profile's entries in ``~/.aws/credentials`` and ``~/.aws/config``. Pure: the environment and the home
directory are passed in."""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import OptionError
from ..fields import bytes_option, number_option, whole_option
from .location import split_url

MiB = 1 << 20


@dataclass(frozen=True)
class StorageOptions:
    """``endpoint``: an S3-compatible store's URL (MinIO, Ceph RGW, ...); by default the AWS SDKs'
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else AWS itself. Plain ``http://`` only where the
    endpoint says so. ``chunk_bytes`` and ``concurrency``: an object is read as ranged requests of
    this size, this many at once (what a rank reads ahead is at most their product, beside the shard
    it holds). Transient failures (5xx, 503 SlowDown, dropped connections, timeouts) are retried with
    exponential backoff and jitter, up to ``max_retries`` times within ``retry_seconds``."""

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    chunk_bytes: int = 8 * MiB
    concurrency: int = 8
    max_retries: int = 6
    retry_seconds: float = 120.0
    timeout_seconds: float = 60.0

    def __post_init__(self) -> None:
        # each of another kind is named here, as the other options objects do (AttributeError 'startswith'
        # for an endpoint of 3, TypeError for chunk_bytes="8MB", which is now taken as the command line takes it)
        for name in ("endpoint", "region", "profile"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise OptionError(f"{name} must be text or None, not {getattr(self, name)!r}")
        if self.endpoint is not None and not _is_endpoint(self.endpoint):
            raise OptionError(f"endpoint must be an http:// or https:// URL, not {self.endpoint!r}")
        object.__setattr__(self, "chunk_bytes", bytes_option(self.chunk_bytes, "chunk_bytes"))
        if self.chunk_bytes < 64 * 1024:
            raise OptionError(f"chunk_bytes must be at least 64 KiB, not {self.chunk_bytes}")
        whole_option(self.concurrency, "concurrency", least=1)
        whole_option(self.max_retries, "max_retries", least=0)
        for name in ("retry_seconds", "timeout_seconds"):
            if not number_option(getattr(self, name), name) > 0:  # NaN too
                raise OptionError(f"{name} must be positive, not {getattr(self, name)}")


@dataclass(frozen=True)
class S3Settings:
    """What an S3 client is made with: no lookups left for it to do (so none reaches an address
    other than ``endpoint``)."""

    endpoint: str | None
    region: str
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None
    anonymous: bool  # no credentials found and the metadata service ruled out: unsigned requests

    @property
    def allow_http(self) -> bool:
        return self.endpoint is not None and self.endpoint.startswith("http://")


def _is_endpoint(url: str) -> bool:
    """An http(s) URL with a host and a port that is a number: obstore's client panicked on the
    others ("called `Result::unwrap()` on an `Err` value: EmptyHost"), a Rust panic for a traceback."""
    try:
        parts = split_url(url)
    except ValueError:
        return False
    return url.startswith(("http://", "https://")) and bool(parts.hostname)


def _section_name(profile: str, config_file: bool) -> str:
    return profile if not config_file or profile == "default" else f"profile {profile}"


def _profile_section(parser: configparser.ConfigParser, profile: str, config_file: bool) -> Mapping[str, str]:
    name = _section_name(profile, config_file)
    return parser[name] if parser.has_section(name) else {}


def _read_ini(path: Path, named: bool) -> configparser.ConfigParser:
    """The file's settings; none where there is no file. ``named``: the environment names the file
    (``AWS_CONFIG_FILE``...): if it is there but cannot be read (a directory, no permission), that is
    an error, not passed over (``ConfigParser.read`` skips what it cannot open), or its credentials or
    endpoint would be missed without a word. The default files, as the SDKs take them, are passed over
    when they cannot be opened: a ``$HOME`` another user's (a container's ``/root``) is common."""
    parser = configparser.ConfigParser()
    try:
        with path.open(encoding="utf-8") as file:
            parser.read_file(file, source=str(path))
    except FileNotFoundError:
        return parser
    except OSError as e:
        if not named:
            return parser
        raise OptionError(f"{path}: cannot be read as an AWS settings file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise OptionError(f"{path}: cannot be read as an AWS settings file: not UTF-8 text") from None
    except configparser.Error as e:
        raise OptionError(f"{path}: cannot be read as an AWS settings file: {str(e).splitlines()[0]}") from None
    return parser


def _settings_file(environ: Mapping[str, str], variable: str, default: Path) -> configparser.ConfigParser:
    named = environ.get(variable)
    return _read_ini(Path(named), named=True) if named else _read_ini(default, named=False)


def resolve_s3(options: StorageOptions, environ: Mapping[str, str], home: Path) -> S3Settings:
    # the first that names one, and what named it (said if the files have no such profile)
    named_by, profile = next(((by, name) for by, name in (("StorageOptions.profile", options.profile),
                                                          ("$AWS_PROFILE", environ.get("AWS_PROFILE")),
                                                          ("$AWS_DEFAULT_PROFILE", environ.get("AWS_DEFAULT_PROFILE")))
                              if name), (None, "default"))
    aws = home / ".aws"
    credentials_file = _settings_file(environ, "AWS_SHARED_CREDENTIALS_FILE", aws / "credentials")
    config_file = _settings_file(environ, "AWS_CONFIG_FILE", aws / "config")
    credentials = _profile_section(credentials_file, profile, config_file=False)
    config = _profile_section(config_file, profile, config_file=True)
    if named_by is not None and profile != "default" and not credentials_file.has_section(profile) \
            and not config_file.has_section(_section_name(profile, config_file=True)):
        # as the SDKs refuse it ("The config profile (x) could not be found"): its endpoint and keys
        # were passed over without a word, and requests went to AWS with none
        raise OptionError(f"the AWS profile {profile!r} ({named_by}) is in neither the credentials file nor the "
                          "config file")
    key = environ.get("AWS_ACCESS_KEY_ID") or credentials.get("aws_access_key_id")
    secret = environ.get("AWS_SECRET_ACCESS_KEY") or credentials.get("aws_secret_access_key")
    token = environ.get("AWS_SESSION_TOKEN") or credentials.get("aws_session_token")
    if bool(key) != bool(secret):
        raise OptionError("AWS credentials need both an access key id and a secret access key; one is missing")
    endpoint = (options.endpoint or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
                or config.get("endpoint_url"))
    if endpoint is not None and not _is_endpoint(endpoint):
        raise OptionError(f"the S3 endpoint must be an http:// or https:// URL, not {endpoint!r}")
    region = (options.region or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
              or config.get("region") or "us-east-1")
    metadata_off = environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"
    return S3Settings(endpoint.rstrip("/") if endpoint else None, region, key, secret, token,
                      anonymous=not key and metadata_off)
